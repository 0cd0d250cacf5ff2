"""Replay: cases x selectors -> verify -> time -> results. The public API of the stage.

`run_replay(ReplayConfig(...))` is a whole replay as one call (what `logitreplay replay` runs), with
`merge_runs` for runs of disjoint subsets of cases. `replay` streams `CaseResult`s for any iterable of
cases; `open_cases` gives the cases of archives and built-in suites; `TimingProtocol` says how they
are timed; `ReplayResult` is the whole report, with
`write_json` / `read_json`. Everything else in this package is an implementation detail.
"""

from logitreplay.replay.engine import case_header, device_checks, replay, replay_case
from logitreplay.replay.environment import environment, sm_clock_mhz
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult, read_json, write_json
from logitreplay.replay.run import ReplayConfig, ReplayRun, case_count, merge_runs, run_replay
from logitreplay.replay.sources import Unreadable, open_cases
from logitreplay.replay.timing import time_launches
from logitreplay.replay.timing_cuda import measure_read_bandwidth
from logitreplay.replay.verify import Failure, OutputBuffer, check_output, expected_values

__all__ = ["CaseResult", "Failure", "OutputBuffer", "ReplayConfig", "ReplayResult", "ReplayRun", "SelectorResult",
           "Timing", "TimingProtocol", "Unreadable", "case_count", "case_header", "check_output", "device_checks",
           "environment", "expected_values", "measure_read_bandwidth", "merge_runs", "open_cases", "read_json",
           "replay", "replay_case", "run_replay", "sm_clock_mhz", "time_launches", "write_json"]
