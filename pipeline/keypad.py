"""Keys a caller presses, gathered into one keypad turn: keys within `timeout_s` of each other
belong together, "#" ends the turn at once (and is not part of it), and 32 keys end it too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

MAX_KEYS = 32


class Keypad:
    """One call's keys; `on_turn(digits)` gets each finished turn's keys."""

    def __init__(self, timeout_s: float, on_turn: Callable[[list[str]], None]) -> None:
        self.timeout_s = timeout_s
        self._on_turn = on_turn
        self._keys: list[str] = []
        self._timer: asyncio.TimerHandle | None = None

    @property
    def collecting(self) -> bool:
        """Keys of an unfinished turn are waiting."""
        return bool(self._keys)

    def press(self, digit: str) -> None:
        self._stop_timer()
        if digit != "#":
            self._keys.append(digit)
        if digit == "#" or len(self._keys) >= MAX_KEYS:
            self._finish()
        else:
            self._timer = asyncio.get_running_loop().call_later(self.timeout_s, self._finish)

    def close(self) -> None:
        """The call ended: keys still waiting are dropped."""
        self._stop_timer()
        self._keys = []

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _finish(self) -> None:
        keys, self._keys, self._timer = self._keys, [], None
        if keys:
            self._on_turn(keys)
