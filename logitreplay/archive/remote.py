"""Remote archive locations: fsspec URLs, and `hf://` URLs pinned to the commit they resolve to.

A replay records where its cases came from; a Hub branch moves, so a location is pinned to one commit
sha before it is read (and the pinned URL is what isolated children and reports see). The Hub client's
exceptions are turned into one-line `ArchiveError`s here, once, for every Hub call of the project.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from urllib.parse import unquote

from logitreplay.errors import ArchiveError, one_line

HF_URL = re.compile(r"^hf://(?P<type>datasets|models|spaces)/(?P<repo>[^/@]+/[^/@]+)(?:@(?P<rev>[^/]+))?(?P<path>/.*)?$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


@contextlib.contextmanager
def hub_errors(what: str) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into one-line `ArchiveError`s that say what to do.

    Messages are ours, never the server's text or request headers, so a token can never be printed.
    """
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except HFValidationError as e:
        raise ArchiveError(f"{what}: {one_line(e)}") from None
    except OfflineModeIsEnabled:
        raise ArchiveError(f"{what}: the Hub is unreachable in offline mode (HF_HUB_OFFLINE is set)") from None
    except RevisionNotFoundError:
        raise ArchiveError(f"{what}: revision not found") from None
    except GatedRepoError:
        raise ArchiveError(f"{what}: the repository is gated; request access on the Hub first") from None
    except RepositoryNotFoundError:
        raise ArchiveError(f"{what}: repository not found (or private and not visible with this token)") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status == 401:
            raise ArchiveError(f"{what}: the Hub refused the credentials (HTTP 401: token missing or invalid); "
                               "set HF_TOKEN or run `hf auth login`") from None
        if status == 403:
            raise ArchiveError(f"{what}: the token lacks permission for this (HTTP 403)") from None
        raise ArchiveError(f"{what}: the Hub answered HTTP {status}") from None
    except LocalEntryNotFoundError:
        raise ArchiveError(f"{what}: the Hub cannot be reached and nothing is cached") from None
    except Exception as e:
        # Transport failures (refused connection, timeout, DNS) come from the HTTP client's own types.
        if isinstance(e, ConnectionError) or type(e).__module__.startswith(("httpx", "httpcore")):
            raise ArchiveError(f"{what}: cannot reach the Hub ({type(e).__name__})") from None
        raise


# ------------------------------------------------------------------------------------ references


def resolve_revision(repo_id: str, revision: str | None, repo_type: str = "dataset",
                     token: str | None = None) -> str:
    """The commit sha `revision` (default: main) points at now."""
    from huggingface_hub import HfApi

    where = f"{repo_type} {repo_id}" + (f"@{revision}" if revision else "")
    with hub_errors(where):
        sha = HfApi(token=token).repo_info(repo_id, repo_type=repo_type, revision=revision).sha
    if not isinstance(sha, str) or not COMMIT_SHA.match(sha):
        # The answer becomes part of paths and URLs: only a 40-hex commit sha is accepted.
        raise ArchiveError(f"{where}: the Hub did not report a commit sha (got {str(sha)[:60]!r})")
    return sha



def pin_url(url: str, token: str | None = None) -> str:
    """`hf://datasets/org/name[@rev]/path` with `rev` replaced by the commit sha it resolves to now.

    Reading through the pinned URL also keeps one archive read consistent if the repo is pushed to
    meanwhile.
    """
    m = HF_URL.match(url)
    if m is None:
        raise ArchiveError(f"{url}: expected hf://datasets/ORG/NAME[@REVISION]/PATH")
    revision = unquote(m["rev"]) if m["rev"] else None
    if revision is not None and COMMIT_SHA.match(revision):
        return url
    sha = resolve_revision(m["repo"], revision, repo_type=m["type"][:-1], token=token)
    return f"hf://{m['type']}/{m['repo']}@{sha}{m['path'] or ''}"
