"""The sandboxed interpreter's trusted prelude (see thicket.envs.math.sandbox).

Run as `python -I -B _sandbox_runner.py` with the job as JSON on stdin. It locks the
process down (namespaces, uid, rlimits, Landlock, an audit hook), replays the history
cells silently, runs the new cell with its output on fd 1 (capped), and reports on the
status fd: a first line {"layers": [...]} and then "error" if the new cell raised.
Standard library only; nothing here may import the project.
"""

import ctypes
import json
import math
import os
import random
import resource
import struct
import sys
import traceback

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_SECCOMP = 22
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446

_libc = ctypes.CDLL(None, use_errno=True)


def _unshare_network():
    if os.geteuid() == 0:
        return "netns" if _libc.unshare(CLONE_NEWNET) == 0 else None
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "userns+netns"
    return None


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities():
    """As root: give up every capability while staying uid 0.

    Without CAP_SYS_RESOURCE / CAP_SYS_ADMIN the kernel enforces RLIMIT_NPROC and refuses
    raising hard limits; without CAP_DAC_OVERRIDE root is an ordinary file owner. (Dropping
    to another uid is not an option: the interpreter may live under a 0700 /root.)
    """
    if os.geteuid() != 0:
        return None
    # Lock root out of regaining capabilities through execve, then empty the bounding set.
    securebits = 0x3F  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED and their locks
    if _libc.prctl(PR_SET_SECUREBITS, securebits, 0, 0, 0) != 0:
        return None
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            return None
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        return None
    return "no-capabilities"


def _seccomp_no_processes():
    """A seccomp filter: fork, vfork, execve, execveat and non-thread clone fail with EPERM.

    (RLIMIT_NPROC does not bind uid 0 at all, capabilities or not.) x86_64 only.
    """
    import platform

    if platform.machine() != "x86_64":
        return None
    audit_arch_x86_64 = 0xC000003E
    fork, vfork, execve, execveat, clone, clone3 = 57, 58, 59, 322, 56, 435
    clone_thread = 0x00010000
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    enosys = 0x00050000 | 38  # clone3: glibc falls back to clone for threads
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JMP|JSET|K, RET|K
    prog = [
        (ld, 0, 0, 4),  # 0: arch
        (jeq, 1, 0, audit_arch_x86_64),  # 1: x86_64 -> 3
        (ret, 0, 0, deny),  # 2: another ABI (x32, i386): refuse everything
        (ld, 0, 0, 0),  # 3: syscall number
        (jeq, 9, 0, fork),  # 4 -> 14 deny
        (jeq, 8, 0, vfork),  # 5 -> 14
        (jeq, 7, 0, execve),  # 6 -> 14
        (jeq, 6, 0, execveat),  # 7 -> 14
        (jeq, 6, 0, clone3),  # 8 -> 15 enosys
        (jeq, 0, 3, clone),  # 9: clone -> 10, else -> 13 allow
        (ld, 0, 0, 16),  # 10: low word of args[0] (the flags)
        (jset, 1, 0, clone_thread),  # 11: a thread -> 13 allow
        (ret, 0, 0, deny),  # 12
        (ret, 0, 0, allow),  # 13
        (ret, 0, 0, deny),  # 14
        (ret, 0, 0, enosys),  # 15
    ]
    raw = b"".join(struct.pack("=HBBI", *insn) for insn in prog)
    filters = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("=HxxxxxxQ", len(prog), ctypes.addressof(filters))
    fprog_buf = ctypes.create_string_buffer(fprog, len(fprog))
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return None
    mode, ptr, zero = ctypes.c_ulong(2), ctypes.c_void_p(ctypes.addressof(fprog_buf)), ctypes.c_ulong(0)
    if _libc.prctl(PR_SET_SECCOMP, mode, ptr, zero, zero) != 0:  # SECCOMP_MODE_FILTER
        return None
    return "seccomp-noproc"


def _limit(kind, value):
    value = int(value)
    resource.setrlimit(kind, (value, value))


def _landlock(workdir):
    """Writes only beneath workdir (and to /dev/null); no execve; no TCP (ABI >= 4)."""
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)  # ..._VERSION
    if abi < 1:
        return None
    write_file, make_any = 1 << 1, 0
    execute = 1 << 0
    remove = (1 << 4) | (1 << 5)
    for bit in range(6, 13):  # MAKE_CHAR .. MAKE_SYM
        make_any |= 1 << bit
    dir_rights = write_file | remove | make_any
    file_rights = write_file
    if abi >= 2:
        dir_rights |= 1 << 13  # REFER (rename/link across folders)
    if abi >= 3:
        dir_rights |= 1 << 14  # TRUNCATE
        file_rights |= 1 << 14
    handled_fs = dir_rights | execute
    handled_net = 0b11 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP
    scoped = 0b11 if abi >= 6 else 0  # abstract unix sockets, signals
    if abi >= 6:
        attr = struct.pack("QQQ", handled_fs, handled_net, scoped)
    elif abi >= 4:
        attr = struct.pack("QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("Q", handled_fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, len(attr), 0)
    if ruleset < 0:
        return None
    try:
        for path, rights in ((workdir, dir_rights), ("/dev/null", file_rights)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)
                if _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, rule, 0) != 0:
                    return None
            finally:
                os.close(fd)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return None
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return None
    finally:
        os.close(ruleset)
    return f"landlock-abi{abi}" + ("+tcp" if handled_net else "")


def _install_hook(workdir):
    root = os.path.realpath(workdir)
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    allowed = {"/dev/null"}
    getrlimit = resource.getrlimit
    refused = {
        "socket.__new__", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
        "socket.gethostbyaddr", "socket.getnameinfo", "socket.sethostname",
        "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
        "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function",
        "os.startfile", "webbrowser.open", "sys.remote_exec",
    }
    path_args = {
        "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
        "os.link": (0, 1), "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,),
        "os.chown": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
        "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,),
        "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (1,), "shutil.chown": (0,),
    }

    def inside(path):
        if isinstance(path, int) or path is None:
            return True  # an open descriptor: checked when it was opened
        if isinstance(path, bytes):
            path = path.decode("utf-8", "surrogateescape")
        resolved = realpath(fspath(path))
        return resolved == root or resolved.startswith(root + sep) or resolved in allowed

    def hook(event, args):
        if event == "open":
            path, _, flags = args
            if flags is not None and flags & write_flags and not inside(path):
                raise PermissionError(f"sandbox: writing outside the working folder is not allowed: {path!r}")
        elif event in path_args:
            for i in path_args[event]:
                if i < len(args) and not inside(args[i]):
                    raise PermissionError(f"sandbox: {event} outside the working folder is not allowed")
        elif event in refused:
            raise PermissionError(f"sandbox: {event} is not allowed")
        elif event in ("resource.setrlimit", "resource.prlimit"):
            kind, limits = (args[0], args[1]) if event == "resource.setrlimit" else (args[1], args[2])
            if limits is not None:
                soft, hard = getrlimit(kind)
                new_soft, new_hard = limits

                def above(new, old):
                    inf = resource.RLIM_INFINITY
                    return old != inf and (new == inf or new > old)

                if above(new_soft, soft) or above(new_hard, hard):
                    raise PermissionError("sandbox: raising resource limits is not allowed")

    sys.addaudithook(hook)
    return "audit-hook"


class _Capped:
    """A text stream writing straight to fd 1, dropping what passes `cap` bytes."""

    def __init__(self, cap):
        self.cap, self.written = cap, 0
        self.encoding, self.errors = "utf-8", "replace"

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        data = text.encode("utf-8", "replace")
        room = self.cap - self.written
        if room > 0:
            os.write(1, data[:room])
        self.written += len(data)
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    def fileno(self):
        return 1


class _Sink(_Capped):
    """A text stream that drops everything (stdin-less helpers, warnings)."""

    def __init__(self):
        super().__init__(0)

    def write(self, text):
        return len(text)


def _run(source, name, namespace):
    """Run one cell like a notebook: the value of a last bare expression is printed."""
    import ast

    try:
        tree = ast.parse(source, filename=name, mode="exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), namespace)  # noqa: S102 - running it is the point
        if last is not None:
            value = eval(compile(last, name, "eval"), namespace)
            if value is not None:
                print(repr(value))
        return True
    except SystemExit:
        return True
    except BaseException:  # noqa: BLE001 - the user's exception is the cell's output
        kind, value, tb = sys.exc_info()
        frames = [f for f in traceback.extract_tb(tb) if f.filename.startswith("<cell")]
        lines = ["Traceback (most recent call last):\n"] if frames else []
        lines += traceback.format_list(frames)
        lines += traceback.format_exception_only(kind, value)
        sys.stderr.write("".join(lines))
        return False


def main():
    job = json.loads(sys.stdin.read())
    status = os.fdopen(job["status_fd"], "w", buffering=1)
    workdir = job["workdir"]
    history, code = job["history"], job["code"]
    cpu_s = float(job["cpu_s"])
    layers = []
    for _, step in (("net", _unshare_network), ("caps", _drop_capabilities)):
        try:
            got = step()
        except OSError:
            got = None
        if got:
            layers.append(got)
    mb = 1024 * 1024
    budget = math.ceil(cpu_s * (len(history) + 1)) + 1
    _limit(resource.RLIMIT_CPU, budget)
    _limit(resource.RLIMIT_AS, int(job["memory_mb"]) * mb)
    _limit(resource.RLIMIT_FSIZE, int(job["file_mb"]) * mb)
    _limit(resource.RLIMIT_NOFILE, 256)
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_NPROC, 0)
    layers.append("rlimits")
    for step in (lambda: _landlock(workdir), _seccomp_no_processes):
        got = step()
        if got:
            layers.append(got)
    os.chdir(workdir)
    layers.append(_install_hook(workdir))
    status.write(json.dumps({"layers": layers}) + "\n")

    sys.dont_write_bytecode = True
    random.seed(0)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    sink = _Sink()
    sys.stdout = sys.stderr = sink
    for i, cell in enumerate(history):
        _run(cell, f"<cell {i}>", namespace)
    # The new cell gets cpu_s seconds beyond what the replay used (limits only go down).
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _limit(resource.RLIMIT_CPU, min(budget, math.ceil(used + cpu_s)))
    out = _Capped(int(job["output_cap"]))
    sys.stdout = sys.stderr = out
    ok = _run(code, f"<cell {len(history)}>", namespace)
    status.write(f"written {out.written}\n")
    if not ok:
        status.write("error\n")
    status.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
