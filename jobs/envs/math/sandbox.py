"""Run untrusted Python (an agent's code) in a throwaway, locked-down subprocess.

`run_cells(history, code, limits)` starts a fresh interpreter (`python -I -B`) in a
fresh temporary folder, silently re-runs `history` (earlier cells, so variables persist
as in a notebook), then runs `code` and returns what it printed.

What is enforced (each layer where the machine allows it; `probe()` reports which):
  - CPU time: RLIMIT_CPU (the kernel kills the process) - the last cell gets `cpu_s`
    seconds beyond what the replayed cells used (rounded up to whole seconds: the limit's
    unit); plus a wall-clock timeout in the parent (the process group is killed).
  - memory: RLIMIT_AS (`memory_mb` of address space; Python raises MemoryError).
  - file size: RLIMIT_FSIZE; open files: RLIMIT_NOFILE; no core dumps.
  - no new processes: an audit hook refuses fork/exec/spawn/system/subprocess;
    RLIMIT_NPROC = 0 (the kernel enforces it for processes without CAP_SYS_RESOURCE /
    CAP_SYS_ADMIN: a root child gives up all its capabilities first, locking itself out
    of regaining them); Landlock refuses execve of any file.
  - no network: a new network namespace (as root, or via an unprivileged user
    namespace) has no interfaces but a down loopback; Landlock (ABI >= 4) refuses TCP
    bind/connect; the audit hook refuses creating any socket and name lookups.
  - no writes outside the folder: Landlock (kernel >= 5.13) allows creating, writing,
    truncating, renaming and removing only beneath the folder (and /dev/null); the audit
    hook refuses the same operations on paths outside it (best effort: it cannot see
    paths relative to a `dir_fd`). TMPDIR and HOME point into the folder.
  - the limits cannot be raised again: without CAP_SYS_RESOURCE the kernel only lets a
    process lower its hard limits, and the hook refuses raising them.
An audit hook alone is not a security boundary (code can reach any Python object); the
kernel layers are. On a machine without Landlock or namespaces only the hook and the
rlimits remain: run such workers in a container that is itself isolated.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

RUNNER = Path(__file__).with_name("_sandbox_runner.py")


@dataclass(frozen=True)
class Limits:
    cpu_s: float = 5.0  # CPU seconds for the new cell
    memory_mb: int = 1024  # address space of the whole interpreter
    file_mb: int = 16  # largest file it may write
    max_output_chars: int = 4000
    wall_factor: float = 3.0  # wall-clock timeout = wall_factor * CPU budget + 2 s


@dataclass(frozen=True)
class RunResult:
    output: str  # stdout and stderr interleaved, truncated to max_output_chars
    status: str  # "ok", "error" (the cell raised), "cpu_limit", "timeout", "killed"
    truncated: int = 0  # characters left out of `output`
    layers: tuple[str, ...] = field(default_factory=tuple)  # isolation layers in effect

    @property
    def stopped(self) -> bool:
        """The interpreter was killed: the cell left no state behind."""
        return self.status in ("cpu_limit", "timeout", "killed")


def _child_env(work: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "TMPDIR": str(work),
        "PYTHONHASHSEED": "0",  # set/dict-of-str orders and so outputs replay exactly
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "LANG": "C.UTF-8",
    }


def run_cells(
    history: list[str] | tuple[str, ...],
    code: str,
    limits: Limits = Limits(),
    python: str | None = None,
) -> RunResult:
    base = Path(tempfile.mkdtemp(prefix="thicket-sandbox-"))
    try:
        work = base / "work"
        work.mkdir()
        out_path = base / "output"
        job = {
            "workdir": str(work),
            "history": list(history),
            "code": code,
            "cpu_s": limits.cpu_s,
            "memory_mb": limits.memory_mb,
            "file_mb": limits.file_mb,
            "output_cap": limits.max_output_chars * 4 + 1024,
        }
        status_r, status_w = os.pipe()
        job["status_fd"] = status_w
        budget = limits.cpu_s * (len(history) + 1)
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                [python or sys.executable, "-I", "-B", str(RUNNER)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=work,
                env=_child_env(work),
                pass_fds=(status_w,),
                start_new_session=True,
            )
        os.close(status_w)
        status = "ok"
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
            proc.wait(timeout=limits.wall_factor * budget + 2.0)
        except subprocess.TimeoutExpired:
            status = "timeout"
        except BrokenPipeError:
            pass
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with os.fdopen(status_r, "rb") as f:
                report = f.read().decode(errors="replace")
        rc = proc.returncode
        if status != "timeout":
            if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # RLIMIT_CPU's soft, then hard limit
                status = "cpu_limit"
            elif rc == 0:
                status = "ok"
            elif rc == 1:
                status = "error"
            else:
                status = "killed"
        lines = report.splitlines()
        layers = tuple(json.loads(lines[0])["layers"]) if lines and lines[0].startswith("{") else ()
        if "error" in lines[1:]:
            status = "error" if status == "ok" else status
        written = next((int(line.split()[1]) for line in lines if line.startswith("written ")), 0)
        raw = out_path.read_bytes()[: job["output_cap"]].decode("utf-8", errors="replace")
        text, truncated = raw, max(written - len(raw), 0)
        if len(text) > limits.max_output_chars:
            head = limits.max_output_chars * 3 // 4
            tail = limits.max_output_chars - head
            truncated += len(text) - head - tail
            text = f"{text[:head]}\n[... {truncated} characters left out ...]\n{text[-tail:]}"
        elif truncated:
            text = f"{text}\n[... {truncated} characters left out ...]"
        if status == "cpu_limit":
            text += f"\n[stopped: the cell used more than {limits.cpu_s:g} s of CPU time]"
        elif status == "timeout":
            text += "\n[stopped: the cell ran past its wall-clock limit]"
        elif status == "killed":
            text += f"\n[stopped: the interpreter died (exit status {rc})]"
        return RunResult(text.strip("\n"), status, truncated, layers)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def probe() -> tuple[str, ...]:
    """The isolation layers a sandboxed cell gets on this machine."""
    return run_cells([], "pass", Limits(cpu_s=5)).layers
