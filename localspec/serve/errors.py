"""A refusal in OpenAI's error shape, and the one check of a JSON whole number.

``ApiError`` carries an HTTP status and OpenAI's error body
(``{"error": {"message", "type", "param", "code"}}``); every refusal of the server is one.
``is_whole`` is true of a JSON integer only (``true`` is a bool, ``31.0`` a float).
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type, "param": param, "code": code}}
        self.headers = headers


def is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
