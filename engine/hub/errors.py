"""What went wrong talking to the hub, in words a user can act on.

``huggingface_hub`` raises its own exception per HTTP status and ``httpx2`` raises its own per network failure;
:func:`hub_errors` turns each into a :class:`HubError` whose message says what happened and what to do.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

__all__ = ["DownloadCancelled", "HubError", "hub_errors", "unreachable"]


class HubError(Exception):
    """A hub request failed; the message is meant for the user as it is."""


class DownloadCancelled(HubError):
    """The caller cancelled a download; its partial file is kept, so a later call resumes it."""


def unreachable(why: object) -> HubError:
    """The one wording for "no network": the hub is out of reach, the rest of Hearth is not."""
    return HubError(f"Hugging Face cannot be reached: {why}; everything else works offline.")


@contextmanager
def hub_errors(repo_id: str = "", filename: str = "", endpoint: str | None = None) -> Iterator[None]:
    """Re-raise hub and network failures inside the block as :class:`HubError` with a clear message."""
    what = f"{filename} in {repo_id}" if filename else repo_id
    site = (endpoint or constants.ENDPOINT).rstrip("/")
    page = f"{site}/{repo_id}" if repo_id else site
    try:
        yield
    except HubError:
        raise
    except OfflineModeIsEnabled as exc:
        raise unreachable("offline mode is on (HF_HUB_OFFLINE)") from exc
    except GatedRepoError as exc:
        raise HubError(
            f"{repo_id} is a gated repository: accept its terms at {page} while logged in, then log in here "
            "(`hf auth login` or the HF_TOKEN variable) to download it."
        ) from exc
    except RepositoryNotFoundError as exc:
        raise HubError(
            f"No model repository {repo_id!r} on Hugging Face (or it is private: log in with `hf auth login` "
            "or set HF_TOKEN if it is yours)."
        ) from exc
    except RevisionNotFoundError as exc:
        raise HubError(f"{repo_id} has no such revision.") from exc
    except RemoteEntryNotFoundError as exc:
        raise HubError(f"{repo_id} has no file {filename!r}; list its files with `files {repo_id}`.") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        if status == 401:
            raise HubError(f"Hugging Face refused access to {what} (401): log in with `hf auth login`.") from exc
        raise HubError(f"Hugging Face answered {status} for {what}: {exc.server_message or exc}") from exc
    except (httpx2.TransportError, httpx2.TooManyRedirects) as exc:
        raise unreachable(f"{type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise HubError(
                f"The disk is full: {what} could not be written ({exc.strerror}). Free some space and download "
                "again; the part already downloaded is kept and the download resumes from there."
            ) from exc
        raise
