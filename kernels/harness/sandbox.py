"""The sandbox a candidate's child process enters before it loads any untrusted code.

Layers, strongest first, each attempted and reported (``SandboxReport``) so a worker
can say which protections actually took effect on its platform:

  environment — variables whose names look like credentials are deleted; HOME,
                TMPDIR, the Triton/CUDA caches and torch.compile's (Inductor) caches
                point into the scratch directory or the worker's shared Triton cache.
  network     — a new user + network namespace (only a loopback that is down: no
                route anywhere), else a seccomp filter that refuses every socket
                except AF_UNIX, else nothing (reported as such).
  filesystem  — Landlock: writes only beneath the scratch directory, the Triton cache
                and /dev (GPU device files), and in GPU mode the child's own /proc
                entries (the CUDA driver writes there); reads everywhere. Where the ABI allows it
                also refuses TCP bind/connect and signals or abstract-socket connects
                to processes outside the sandbox (the worker among them).
  limits      — CPU seconds, file size, open files, no core dumps; address space only
                in interpreter mode, because CUDA reserves terabytes of virtual space.

Everything here is raw Linux syscalls through ctypes (Python 3.11 has no os.unshare),
so it needs nothing beyond the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
import resource
import signal
import struct
import tempfile
from dataclasses import dataclass

# Variables whose names look like credentials never reach candidate code.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|SESSION|COOKIE)", re.I)
_SECRET_PREFIXES = ("AWS_", "MLFLOW_", "PREFECT_", "HF_", "HUGGING", "OPENAI", "ANTHROPIC", "AZURE_", "GOOGLE_",
                    "GCP_", "S3_", "RAY_", "GITHUB_", "GH_", "WANDB_", "DATABASE_", "PG", "KUBE")

NETWORK_CHOICES = ("namespace", "seccomp", "off")
FILESYSTEM_CHOICES = ("landlock", "off")

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_PR_SET_CHILD_SUBREAPER = 36
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
# Landlock filesystem rights that change the file system (reads and execution are not restricted).
_FS_WRITE_ABI1 = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write, remove, make *
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
# seccomp: the architecture tag and the socket(2) / io_uring_setup(2) syscall numbers per machine.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
_AF_UNIX = 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


@dataclass(frozen=True)
class SandboxPolicy:
    """What the child should enter; the worker builds one per candidate."""

    scratch_dir: str
    triton_cache_dir: str
    gpu: bool
    network: str = "namespace"  # best protection to try first; falls back down NETWORK_CHOICES
    filesystem: str = "landlock"
    cpu_seconds: int = 600
    address_space_bytes: int | None = 8 << 30  # ignored in GPU mode
    open_files: int = 1024
    file_size_bytes: int = 512 << 20

    def __post_init__(self) -> None:
        if self.network not in NETWORK_CHOICES:
            raise ValueError(f"unknown network protection {self.network!r}; known: {', '.join(NETWORK_CHOICES)}")
        if self.filesystem not in FILESYSTEM_CHOICES:
            raise ValueError(f"unknown filesystem protection {self.filesystem!r}; "
                             f"known: {', '.join(FILESYSTEM_CHOICES)}")


@dataclass(frozen=True)
class SandboxReport:
    """Which protections took effect in one child, and why a stronger one did not."""

    network: str  # "namespace" | "seccomp" | "off"
    filesystem: str  # "landlock-abi<N>" | "off"
    limits: tuple[str, ...]
    scrubbed: tuple[str, ...]  # names of the environment variables removed
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        text = f"network={self.network} filesystem={self.filesystem} limits={','.join(self.limits)}"
        return text + (f" ({'; '.join(self.notes)})" if self.notes else "")


# The directories this process may write beneath, once Landlock confines its writes (set by ``enter``); empty while
# writes are not confined, so a refused write is then the operating system's own permission, not the sandbox's.
_confined_to: tuple[str, ...] = ()


def denied_write(exc: BaseException) -> str:
    """A clause for an error that is the sandbox refusing a write: a PermissionError (itself, or what caused it)
    naming a path beneath none of the directories this process may write, while Landlock confines its writes;
    else ''. Appended to the verdict's error so that a kernel writing to a fixed path (``/tmp/build``) says why."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, PermissionError) and exc.filename and _confined_to:
            path = os.path.realpath(os.fsdecode(exc.filename))
            if not any(path == d or path.startswith(d.rstrip("/") + "/") for d in _confined_to):
                return (f" (the sandbox lets a candidate write only beneath its scratch directory, which TMPDIR, HOME, "
                        f"tempfile and torch's extension builds use; {path} is outside it)")
            return ""
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return ""


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a credential."""
    return bool(_SECRET_NAME.search(name)) or name.upper().startswith(_SECRET_PREFIXES)


def scrub_environment() -> tuple[str, ...]:
    """Delete credential-looking variables from this process's environment; returns their names."""
    removed = tuple(n for n in os.environ if is_secret_name(n))
    for name in removed:
        del os.environ[name]
    return removed


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 where Landlock is missing or disabled."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


def _oserror(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def _enter_network_namespace() -> None:
    """unshare(CLONE_NEWUSER | CLONE_NEWNET), mapping our own uid/gid so file ownership reads the same.

    The user namespace is what lets an unprivileged process do this, and it also drops
    the capabilities (held only inside the new namespace) that a root child could use
    to setns() back into the host's network.
    """
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(ctypes.c_int(_CLONE_NEWUSER | _CLONE_NEWNET)) != 0:
        raise _oserror("unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass  # unmapped ids read as 'nobody'; the namespace still has no network


def _no_new_privs() -> None:
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _oserror("prctl(PR_SET_NO_NEW_PRIVS)")


def _refuse_sockets() -> None:
    """A seccomp filter: socket(2) fails with EACCES for every family but AF_UNIX; io_uring too."""
    machine = platform.machine()
    if machine not in _SECCOMP_ARCH:
        raise OSError(errno.ENOSYS, f"no seccomp socket filter for machine {machine!r}")
    arch, nr_socket, nr_io_uring = _SECCOMP_ARCH[machine]
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EACCES
    program = [  # (code, jt, jf, k); jumps are relative to the next instruction
        (ld_w_abs, 0, 0, 4),           # 0: A = arch
        (jeq_k, 1, 0, arch),           # 1: native arch -> 3
        (ret_k, 0, 0, deny),           # 2: foreign ABI (e.g. i386 socketcall) refused
        (ld_w_abs, 0, 0, 0),           # 3: A = syscall number
        (jge_k, 5, 0, 0x40000000),     # 4: x32 numbers -> deny (10)
        (jeq_k, 4, 0, nr_io_uring),    # 5: io_uring_setup -> deny (10)
        (jeq_k, 1, 0, nr_socket),      # 6: socket -> 8
        (ret_k, 0, 0, allow),          # 7: everything else allowed
        (ld_w_abs, 0, 0, 16),          # 8: A = low word of args[0] (the address family)
        (jeq_k, 1, 0, _AF_UNIX),       # 9: AF_UNIX -> 11
        (ret_k, 0, 0, deny),           # 10
        (ret_k, 0, 0, allow),          # 11
    ]
    raw = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(raw, len(raw))
    prog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(buf))
    prog_buf = ctypes.create_string_buffer(prog, len(prog))
    _no_new_privs()
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, prog_buf, 0, 0) != 0:
        raise _oserror("prctl(PR_SET_SECCOMP)")


def _landlock(writable: list[str], abi: int) -> list[str]:
    """Restrict writes to ``writable`` (directories); returns what else the ruleset refuses."""
    fs = _FS_WRITE_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    attr_buf = ctypes.create_string_buffer(attr[:size], size)
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr_buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _oserror("landlock_create_ruleset")
    try:
        for path in writable:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", fs, fd), 12)
                if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                                 rule, ctypes.c_uint32(0)) != 0:
                    raise _oserror(f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        _no_new_privs()
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _oserror("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return (["tcp"] if net else []) + (["signals", "abstract-unix"] if scoped else [])


def _set_limits(policy: SandboxPolicy) -> list[str]:
    limits = [(resource.RLIMIT_CORE, 0, "core=0"),
              (resource.RLIMIT_CPU, policy.cpu_seconds, f"cpu={policy.cpu_seconds}s"),
              (resource.RLIMIT_NOFILE, policy.open_files, f"nofile={policy.open_files}"),
              (resource.RLIMIT_FSIZE, policy.file_size_bytes, f"fsize={policy.file_size_bytes >> 20}MiB")]
    if not policy.gpu and policy.address_space_bytes:
        limits.append((resource.RLIMIT_AS, policy.address_space_bytes, f"as={policy.address_space_bytes >> 20}MiB"))
    applied = []
    for which, value, label in limits:
        _, hard = resource.getrlimit(which)
        # For CPU the hard limit comes 5 s after the soft one, so SIGXCPU arrives before SIGKILL.
        new_hard = value + 5 if which == resource.RLIMIT_CPU else value
        if hard != resource.RLIM_INFINITY:
            value, new_hard = min(value, hard), min(new_hard, hard)
        resource.setrlimit(which, (value, new_hard))
        applied.append(label)
    # Past the file-size limit a write fails with EFBIG (an exception the harness reports)
    # instead of the default SIGXFSZ killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return applied


def enter(policy: SandboxPolicy) -> SandboxReport:
    """Apply every layer of ``policy`` to this process (irreversibly) and report what took effect."""
    global _confined_to
    scrubbed = scrub_environment()
    os.setpgrp()  # its own process group, so the worker can kill whatever it forks along with it
    # Whatever it forks stays its descendant even when the parent between them exits (a daemon's double fork): the
    # verification asks whether the child has processes of its own (kernelcast.kernels.harness.verify.own_processes).
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    os.chdir(policy.scratch_dir)
    os.environ.update(HOME=policy.scratch_dir, TMPDIR=policy.scratch_dir, TRITON_HOME=policy.scratch_dir,
                      TRITON_CACHE_DIR=policy.triton_cache_dir,
                      CUDA_CACHE_PATH=os.path.join(policy.triton_cache_dir, "nv"),
                      XDG_CACHE_HOME=os.path.join(policy.scratch_dir, "cache"),
                      TORCH_HOME=os.path.join(policy.scratch_dir, "torch"),
                      # torch.compile: Inductor's caches in the scratch directory (its default, /tmp/torchinductor_<user>,
                      # is outside what the child may write), compiled in this process rather than a pool of workers
                      TORCHINDUCTOR_CACHE_DIR=os.path.join(policy.scratch_dir, "inductor"),
                      TORCHINDUCTOR_COMPILE_THREADS="1")
    tempfile.tempdir = None  # recomputed from TMPDIR on next use: the fork server may have cached another
    os.umask(0o077)
    limits = _set_limits(policy)
    notes: list[str] = []

    network = "off"
    for choice in NETWORK_CHOICES[NETWORK_CHOICES.index(policy.network):]:
        if choice == "off":
            break
        try:
            _enter_network_namespace() if choice == "namespace" else _refuse_sockets()
            network = choice
            break
        except OSError as exc:
            notes.append(f"{choice} unavailable: {exc.strerror or exc}")

    filesystem = "off"
    if policy.filesystem == "landlock":
        abi = landlock_abi()
        if abi <= 0:
            notes.append("landlock unavailable: writes are confined only by the working directory and TMPDIR")
        else:
            # The CUDA driver writes into its own process's /proc entries while it initialises
            # (measured: without write access beneath /proc/<pid>, cudaGetDeviceCount fails with
            # error 304); the entries of other processes stay read-only.
            own_proc = f"/proc/{os.getpid()}" if policy.gpu else ""
            writable = [p for p in (policy.scratch_dir, policy.triton_cache_dir, "/dev", own_proc)
                        if p and os.path.isdir(p)]
            try:
                extra = _landlock(writable, abi)
                _confined_to = tuple(os.path.realpath(p) for p in writable)
                filesystem = f"landlock-abi{abi}"
                if extra:
                    filesystem += "+" + "+".join(extra)
            except OSError as exc:
                notes.append(f"landlock failed: {exc.strerror or exc}")
    return SandboxReport(network=network, filesystem=filesystem, limits=tuple(limits), scrubbed=scrubbed,
                         notes=tuple(notes))
