"""Typed, validated store keys: what a caller may ask for, and the changelog key it maps to.

A store is addressed by its job's key field (``user_id``, ``voter_id``, ``patient_id``); a windowed
store also by the window's start (epoch ms, aligned to the window size), because its changelog key is
``<key>@<window_start_ms>`` (spark_jobs/reference/jobs/patient_heart_rate.py); a session store by the session's start
(epoch ms, any), its changelog key ``<key>@<session_start_ms>`` (spark_jobs/reference/jobs/user_sessions.py). Anything else is refused with a
message that says what was expected, before any state is touched.
"""

from __future__ import annotations

import dataclasses
import unicodedata

from spark_jobs.registry import JobSpec, StoreSpec

MAX_KEY_LENGTH = 256
WINDOW_SEPARATOR = "@"


class InvalidKey(ValueError):
    """A key the store cannot hold; the message says why."""


@dataclasses.dataclass(frozen=True)
class KeySchema:
    """How one store's keys look."""

    field: str
    windowed: bool = False
    window_advance_ms: int | None = None

    @classmethod
    def of(cls, spec: JobSpec, store: StoreSpec) -> KeySchema:
        """A session store is addressed like a windowed one (``window_start``: the session's start), whose
        starts are aligned to nothing."""
        if store.kind == "session":
            return cls(spec.key_field, True, None)
        return cls(spec.key_field, store.kind == "windowed", store.window_advance_ms)

    @property
    def _start_rule(self) -> str:
        return f"a multiple of {self.window_advance_ms}" if self.window_advance_ms else "a session's start"

    def describe(self) -> dict:
        parts = {self.field: f"string, 1-{MAX_KEY_LENGTH} printable characters"}
        if self.windowed:
            parts["window_start"] = f"integer epoch milliseconds, {self._start_rule}"
        return parts

    def validate_text(self, value: str, what: str) -> str:
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY_LENGTH:
            raise InvalidKey(f"{what} must be 1-{MAX_KEY_LENGTH} characters")
        if any(unicodedata.category(c).startswith("C") for c in value):
            raise InvalidKey(f"{what} must not contain control or unassigned characters")
        if self.windowed and WINDOW_SEPARATOR in value:
            raise InvalidKey(f"{what} of a windowed store must not contain {WINDOW_SEPARATOR!r}")
        return value

    def encode(self, key: str, window_start: int | None = None) -> str:
        """The changelog key for ``key`` (and ``window_start`` in a windowed store)."""
        self.validate_text(key, self.field)
        if not self.windowed:
            if window_start is not None:
                raise InvalidKey("window_start applies to windowed stores only")
            return key
        if window_start is None:
            raise InvalidKey(f"a windowed store needs window_start (epoch ms, {self._start_rule})")
        if window_start < 0 or (self.window_advance_ms and window_start % self.window_advance_ms):
            raise InvalidKey(
                f"window_start {window_start} is not a window start (a multiple of {self.window_advance_ms} ms)"
            )
        return f"{key}{WINDOW_SEPARATOR}{window_start}"

    def decode(self, stored: str) -> dict:
        """A changelog key as typed parts, e.g. ``{"patient_id": "p1", "window_start": 60000}``."""
        if not self.windowed:
            return {self.field: stored}
        key, _, start = stored.rpartition(WINDOW_SEPARATOR)
        return {self.field: key, "window_start": int(start) if start.isdigit() else start}
