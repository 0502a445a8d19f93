"""The sidecar process is watched both ways: it ends soon after its parent is killed, and a
sidecar that dies while starting is reported at once with its exit code and stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ooospec.sidecar.service import SidecarService, SidecarStartError
from ooospec.sidecar.specs import dying_sidecar

PARENT = '''
import sys, time
from ooospec.sidecar.service import SidecarService
from ooospec.sidecar.specs import oracle_sidecar

if __name__ == "__main__":
    service = SidecarService(oracle_sidecar({})).start()
    print(service.pid, flush=True)
    time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (dead, not yet reaped by its new parent) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_sidecar_ends_when_its_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        sidecar = int(parent.stdout.readline())
        assert _alive(sidecar)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        for _ in range(100):  # polls only: the sidecar checks its parent every PARENT_POLL_S
            if not _alive(sidecar):
                break
            time.sleep(0.1)
        assert not _alive(sidecar), f"sidecar {sidecar} outlived its killed parent"
    finally:
        parent.kill()


@pytest.mark.parametrize("exit_code, sig, expected", [(7, None, "exit code 7"), (0, signal.SIGKILL, "exit code -9")],
                         ids=["exits", "killed"])
def test_a_sidecar_that_dies_while_starting_is_reported_with_its_exit_code_and_stderr(exit_code, sig, expected):
    service = SidecarService(dying_sidecar(exit_code, message="cannot load the sidecar model", signal=sig),
                             startup_timeout_s=600)
    with pytest.raises(SidecarStartError, match=expected) as raised:
        service.start()
    assert "cannot load the sidecar model" in str(raised.value)
    assert not service.alive
