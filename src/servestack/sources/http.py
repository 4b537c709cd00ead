"""HTTP sessions with retries and backoff, shared by every source."""

from __future__ import annotations

from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from servestack.errors import NetworkError

USER_AGENT = "servestack"
# urllib3 waits BACKOFF_S * 2**(n - 1) before the n-th retry after the first: 0, 1, 2, 4 s for four.
# Read at each session, so a test of the retries sets it to 0 and does not wait them out.
BACKOFF_S = 0.5


def session(retries: int = 4, backoff: float | None = None) -> requests.Session:
    """A session that retries connection failures, 429 and 5xx with exponential backoff."""
    retry = Retry(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        backoff_factor=BACKOFF_S if backoff is None else backoff,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=frozenset({"GET", "HEAD"}),
        respect_retry_after_header=True,
        raise_on_status=False,
    )
    s = requests.Session()
    adapter = HTTPAdapter(max_retries=retry)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    s.headers["User-Agent"] = USER_AGENT
    return s


def get(s: requests.Session, url: str, *, what: str, timeout: float = 30, **kwargs: Any) -> requests.Response:
    """GET that turns an unreachable service into a NetworkError naming what was being fetched."""
    try:
        return s.get(url, timeout=timeout, **kwargs)
    except requests.RequestException as exc:
        raise NetworkError(f"{what}: could not reach {url} after retries ({type(exc).__name__}: {_short(exc)})") from None


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) < 200 else text[:200] + "..."
