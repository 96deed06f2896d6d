"""One watch request's events, read line by line from the raw HTTP response.

* Every ERROR Status is an event; a clean end of stream is told from a broken one.
* ``close()`` shuts the socket down, so a thread blocked in ``recv`` wakes at once.

Design: docs/design/apiserver-client.md
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import urllib3

from himitsu_controller.runtime.client.errors import TransportError, describe_exception

__all__ = ["WatchDecodeError", "WatchStream"]


class WatchDecodeError(Exception):
    """The stream is intact but sent something that is not a watch event (client-go
    relists then, while a broken connection, a TransportError, is resumed)."""


class WatchStream:
    """Event dicts (``type``, ``object``) until the server ends the stream (StopIteration),
    the connection breaks (TransportError) or a line is no event (WatchDecodeError)."""

    def __init__(self, response: urllib3.HTTPResponse) -> None:
        self._response = response
        self._closed = threading.Event()
        self._release_lock = threading.Lock()
        self._released = False
        self._lines = self._read_lines()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
        self._release()

    def __iter__(self) -> WatchStream:
        return self

    def __next__(self) -> dict[str, Any]:
        line = next(self._lines)
        try:
            event = json.loads(line)
        except ValueError:
            self._release()
            raise WatchDecodeError("watch stream sent a line that is not JSON") from None
        if not isinstance(event, dict) or "type" not in event:
            self._release()
            raise WatchDecodeError("watch stream sent something that is not an event")
        return event

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Abort the stream, promptly and quietly, even from another thread."""
        if self._closed.is_set():
            return
        self._closed.set()
        # Wakes a thread blocked reading; if already released, there is nothing to wake.
        with contextlib.suppress(OSError, ValueError, RuntimeError, AttributeError):
            self._response.shutdown()

    def _read_lines(self) -> Iterator[bytes]:
        buffer = b""
        try:
            for chunk in self._chunks():
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if self._closed.is_set():
                        return
                    if line.strip():
                        yield line
            if buffer.strip() and not self._closed.is_set():
                yield buffer
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            if self._closed.is_set():
                return
            raise TransportError(f"watch stream broken: {describe_exception(exc)}") from None
        finally:
            self._release()

    def _chunks(self) -> Iterator[bytes]:
        response = self._response
        if response.chunked and response.supports_chunked_reads():
            return response.read_chunked(decode_content=True)
        return iter(lambda: response.read1(65536), b"")

    def _release(self) -> None:
        with self._release_lock:
            if self._released:
                return
            self._released = True
        try:
            # A stream that did not end cleanly leaves the connection unusable.
            self._response.close()
        finally:
            self._response.release_conn()
