"""The worker process alone: what it tells its supervisor when ggml's server cannot bind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from skippyctl.stages.stage_worker import EXIT_SERVER_RETURNED
from tests.stages.helpers import READ_TIMEOUT_S


def test_a_bind_failure_is_reported_as_address_in_use_and_the_worker_exits() -> None:
    read_fd, write_fd = os.pipe()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "skippyctl.stages.stage_worker",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--threads",
                "1",
                "--status-fd",
                str(write_fd),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(write_fd,),
        )
        os.close(write_fd)
        try:
            code = process.wait(READ_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    with os.fdopen(read_fd, "rb") as status:
        messages = [json.loads(line) for line in status.read().splitlines()]
    assert code == EXIT_SERVER_RETURNED
    assert [m["status"] for m in messages] == ["serving", "server_returned"]
    assert messages[0]["device"] == "CPU" and messages[0]["memory_total_bytes"] > 0
    assert messages[1]["address_in_use"] is True
