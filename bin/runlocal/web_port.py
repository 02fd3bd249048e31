"""The admin's port on 127.0.0.1: free before anything starts, answering once web is up."""

from __future__ import annotations

import socket

from .console import RunError


def check_port_free(port: int) -> None:
    """Fail early, with a sentence, when something already listens on the web port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise RunError(
                f"127.0.0.1:{port} is in use ({exc.strerror}); stop what listens there "
                "or pass --web-port (make run RUN_ARGS='--web-port 8001')"
            ) from None


def port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
