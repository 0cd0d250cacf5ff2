"""`sglang.srt.plugins.load_plugins`: every process (scheduler, detokenizer, engine) runs the callables of the
`sglang.srt.plugins` entry point group once, keeping only the names in `SGLANG_PLUGINS` when it is set."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from sglang.srt.environ import envs

logger = logging.getLogger(__name__)

GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
_plugins_loaded = False


def load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    allowed = envs.SGLANG_PLUGINS.get()
    allowed_set = None if not allowed else {x.strip() for x in allowed.split(",") if x.strip()}
    for ep in entry_points(group=GENERAL_PLUGINS_GROUP):
        if allowed_set is not None and ep.name not in allowed_set:
            continue
        try:
            ep.load()()
        except Exception:
            logger.exception("Failed to execute general plugin: %s", ep.name)
