"""The sandbox a candidate's child process enters before it loads any untrusted code.

Layers, strongest first, each attempted and reported (``SandboxReport``) so a worker
can say which protections actually took effect on its platform:

  environment — variables whose names look like credentials are deleted; HOME,
                TMPDIR, the Triton/CUDA caches and torch.compile's (Inductor) caches
                point into the scratch directory, the Triton cache included: a cache
                children shared would let one plant a compiled kernel for another.
  network     — a new user + network + IPC namespace (only a loopback that is down: no
                route anywhere; SysV shared memory and message queues of its own), else a
                seccomp filter that refuses every socket except AF_UNIX (and SysV IPC
                where no IPC namespace could be made), else nothing (reported as such). The
                kernel keyrings are refused either way (seccomp).
  filesystem  — Landlock: writes only beneath the scratch directory, to the device
                files CUDA and Python use (nothing can be made in /dev: no /dev/shm) and in
                GPU mode the child's own /proc entries (the CUDA driver writes there);
                reads everywhere except the homes (/root, /home, the worker's HOME), the
                container's secrets (/run/secrets, /run/credentials, /run/user), the
                password hashes and host keys in /etc, /dev/shm, and other children's
                scratch directories (other workers' folders), less the Python installation,
                the imported packages and tools found there. Where the ABI allows it also refuses
                TCP bind/connect and signals or abstract-socket connects to processes
                outside the sandbox (the worker among them).
  capabilities — every capability dropped (bounding and ambient sets included), so a
                root child cannot read another process's memory or environment
                (/proc/<pid>/environ of the worker and its ancestors) without the namespace.
  environments — last, the child checks that no process's environment holding a
                credential-looking variable is readable from where it stands, its own
                included, and refuses to go on if one is (``SandboxError``).
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
import pwd
import re
import resource
import signal
import struct
import sys
import tempfile
from dataclasses import dataclass

# Variables whose names look like credentials never reach candidate code.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|SESSION|COOKIE)", re.I)
_SECRET_PREFIXES = ("AWS_", "MLFLOW_", "PREFECT_", "HF_", "HUGGING", "OPENAI", "ANTHROPIC", "AZURE_", "GOOGLE_",
                    "GCP_", "S3_", "RAY_", "GITHUB_", "GH_", "WANDB_", "DATABASE_", "PG", "KUBE")

NETWORK_CHOICES = ("namespace", "seccomp", "off")
FILESYSTEM_CHOICES = ("landlock", "off")
EXPOSED_CHOICES = ("refuse", "report")  # what a child does when it can read an environment holding a secret

_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWIPC = 0x10000000, 0x40000000, 0x08000000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 4, 24, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
# Landlock filesystem rights: those that change the file system, and reading a file's contents (listing a
# folder, and execution, are not restricted: a file's name and size are no secret, its contents may be).
_FS_WRITE_ABI1 = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write, remove, make *
_FS_WRITE_FILE, _FS_READ_FILE = 1 << 1, 1 << 2
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
# seccomp: the architecture tag, the socket(2) / io_uring_setup(2) syscall numbers, those that make SysV IPC
# objects or POSIX message queues (shmget, semget, msgget, mq_open), which outlive the process, and the kernel
# keyrings' (add_key, request_key, keyctl: the user keyring outlives the process too), per machine.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425, (29, 64, 68, 240), (248, 249, 250)),
                 "aarch64": (0xC00000B7, 198, 425, (194, 190, 186, 180), (217, 218, 219))}
_AF_UNIX = 1

# Device files a child may write: CUDA's (/dev/nvidia*, /dev/nvidia-caps/..., /dev/nvidia-uvm...) and the
# ones Python and shells open for writing. Nothing can be made anywhere in /dev, so /dev/shm and /dev/mqueue,
# which outlive the child and are shared between children, take no files.
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_DEVICE_PREFIXES = ("nvidia",)
# Places whose files a child may not read: homes (credentials files, keys, tokens, caches of other tools), the
# secrets a container runtime mounts, the password hashes and host keys. The worker's own HOME is added.
_HIDDEN = ("/root", "/home", "/run/secrets", "/run/credentials", "/run/user", "/var/run/secrets",
           "/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/ssh", "/dev/shm", "/dev/mqueue")
# The folders of a worker (``tempfile.mkdtemp`` prefixes in kernelcast.kernels.harness.worker) and of its children:
# another child's scratch directory, read while that child runs, would be a channel between the two.
_WORKER_PREFIX, _CHILD_PREFIXES = "kernelcast-worker-", ("cand-", "probe-")
# Variables naming folders of tools a child runs or libraries it loads: readable even inside a hidden place.
_TOOL_VARIABLES = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDNN_HOME", "TRITON_PTXAS_PATH", "TRITON_CUOBJDUMP_PATH",
                   "TRITON_NVDISASM_PATH", "TRITON_LIBDEVICE_PATH", "TRITON_CUDACRT_PATH", "TRITON_CUDART_PATH",
                   "KERNELCAST_TASKS", "KERNELCAST_GPU_LOCK")
_TOOL_PATH_VARIABLES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "CPATH", "LIBRARY_PATH")

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
    readable: tuple[str, ...] = ()  # further paths the child reads though they lie in a hidden place (the GPU lock)
    exposed_environments: str = "refuse"  # EXPOSED_CHOICES

    def __post_init__(self) -> None:
        if self.network not in NETWORK_CHOICES:
            raise ValueError(f"unknown network protection {self.network!r}; known: {', '.join(NETWORK_CHOICES)}")
        if self.filesystem not in FILESYSTEM_CHOICES:
            raise ValueError(f"unknown filesystem protection {self.filesystem!r}; "
                             f"known: {', '.join(FILESYSTEM_CHOICES)}")
        if self.exposed_environments not in EXPOSED_CHOICES:
            raise ValueError(f"unknown exposed_environments {self.exposed_environments!r}; "
                             f"known: {', '.join(EXPOSED_CHOICES)}")


@dataclass(frozen=True)
class SandboxReport:
    """Which protections took effect in one child, and why a stronger one did not."""

    network: str  # "namespace" | "seccomp" | "off"
    filesystem: str  # "landlock-abi<N>" | "off"
    limits: tuple[str, ...]
    scrubbed: tuple[str, ...]  # names of the environment variables removed
    notes: tuple[str, ...] = ()
    ipc: str = ""  # "namespace" (SysV IPC and message queues of its own) | "seccomp" (refused) | "shared"
    keyrings: str = ""  # "refused" (seccomp) | "shared" (the user keyring outlives the child)
    writes: str = ""  # where Landlock lets it write: "scratch+devices" (+"+own-proc" in GPU mode) | "anywhere"
    reads: str = ""  # "all-but:<hidden places>" | "all"
    capabilities: str = ""  # "none" | "kept: <why>"
    environments: str = ""  # "hidden" | "exposed: <pid (command): variable names>, ..."
    triton_cache: str = ""  # "private" (in the scratch directory)

    def summary(self) -> str:
        text = f"network={self.network} filesystem={self.filesystem} limits={','.join(self.limits)}"
        for name in ("ipc", "keyrings", "writes", "reads", "capabilities", "environments", "triton_cache"):
            if getattr(self, name):
                text += f" {name.replace('_', '-')}={getattr(self, name)}"
        return text + (f" ({'; '.join(self.notes)})" if self.notes else "")


class SandboxError(RuntimeError):
    """The child cannot be confined as its policy demands (an environment holding a secret stays readable)."""


# The directories this process may write beneath, once Landlock confines its writes (set by ``enter``); empty while
# writes are not confined, so a refused write is then the operating system's own permission, not the sandbox's.
_confined_to: tuple[str, ...] = ()
# The places whose files it may not read, once Landlock confines its reads (set by ``enter``).
_hidden: tuple[str, ...] = ()


def _beneath(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def denied_write(exc: BaseException) -> str:
    """A clause for an error that is the sandbox refusing a write or a read: a PermissionError (itself, or what caused
    it) naming a path beneath none of the directories this process may write, while Landlock confines its writes;
    else ''. Appended to the verdict's error so that a kernel writing to a fixed path (``/tmp/build``) says why."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, PermissionError) and exc.filename and _confined_to:
            path = os.path.realpath(os.fsdecode(exc.filename))
            if any(_beneath(path, d) for d in _confined_to):
                return ""
            if any(_beneath(path, d) for d in _hidden):
                return (f" (the sandbox hides the files of homes, of the machine's secrets and of other children from "
                        f"a candidate; {path} is among them)")
            return (f" (the sandbox lets a candidate write only beneath its scratch directory, which TMPDIR, HOME, "
                    f"tempfile and torch's extension builds use; {path} is outside it)")
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


def hide_this_process() -> bool:
    """Make this process non-dumpable: then a process of its user without CAP_SYS_PTRACE over it (a sandboxed child,
    which has dropped its capabilities or lives in a user namespace of its own) cannot read its memory, maps or
    start-up environment through /proc/<pid>. For the worker, whose environment and memory hold its credentials.
    Also means no core dump of it; returns whether it took effect."""
    return _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 where Landlock is missing or disabled."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


def _oserror(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def _enter_network_namespace() -> bool:
    """unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC), mapping our own uid/gid so file ownership reads the
    same; returns whether the IPC namespace came too (else the user and network ones alone).

    The user namespace is what lets an unprivileged process do this, and it also drops
    the capabilities (held only inside the new namespace) that a root child could use
    to setns() back into the host's network or to read other processes' /proc entries.
    The IPC namespace gives the child SysV shared memory and message queues of its own,
    gone with it, instead of the machine's, which outlive it and every child shares.
    """
    uid, gid = os.getuid(), os.getgid()
    with_ipc = _libc.unshare(ctypes.c_int(_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWIPC)) == 0
    if not with_ipc and _libc.unshare(ctypes.c_int(_CLONE_NEWUSER | _CLONE_NEWNET)) != 0:
        raise _oserror("unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass  # unmapped ids read as 'nobody'; the namespace still has no network
    return with_ipc


def _no_new_privs() -> None:
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _oserror("prctl(PR_SET_NO_NEW_PRIVS)")


def _refuse_sockets(refuse_ipc: bool = False, sockets: bool = True) -> None:
    """A seccomp filter: socket(2) fails with EACCES for every family but AF_UNIX (unless not ``sockets``);
    io_uring and the kernel keyrings too, and with ``refuse_ipc`` the calls that make SysV IPC objects or POSIX
    message queues."""
    machine = platform.machine()
    if machine not in _SECCOMP_ARCH:
        raise OSError(errno.ENOSYS, f"no seccomp socket filter for machine {machine!r}")
    arch, nr_socket, nr_io_uring, nr_ipc, nr_keys = _SECCOMP_ARCH[machine]
    refused = (nr_io_uring,) + nr_keys + (nr_ipc if refuse_ipc else ())
    nr_socket = nr_socket if sockets else 0xFFFFFFFF  # a number no call has: every socket allowed
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EACCES
    n = len(refused)
    program = [  # (code, jt, jf, k); jumps are relative to the next instruction
        (ld_w_abs, 0, 0, 4),                  # A = arch
        (jeq_k, 1, 0, arch),                  # native arch -> skip the next
        (ret_k, 0, 0, deny),                  # foreign ABI (e.g. i386 socketcall) refused
        (ld_w_abs, 0, 0, 0),                  # A = syscall number
        (jge_k, n + 4, 0, 0x40000000),        # x32 numbers -> deny
        *[(jeq_k, n + 3 - i, 0, nr) for i, nr in enumerate(refused)],  # refused calls -> deny
        (jeq_k, 1, 0, nr_socket),             # socket -> look at its family
        (ret_k, 0, 0, allow),                 # everything else allowed
        (ld_w_abs, 0, 0, 16),                 # A = low word of args[0] (the address family)
        (jeq_k, 1, 0, _AF_UNIX),              # AF_UNIX -> allow
        (ret_k, 0, 0, deny),
        (ret_k, 0, 0, allow),
    ]
    raw = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(raw, len(raw))
    prog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(buf))
    prog_buf = ctypes.create_string_buffer(prog, len(prog))
    _no_new_privs()
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, prog_buf, 0, 0) != 0:
        raise _oserror("prctl(PR_SET_SECCOMP)")


def _devices() -> list[str]:
    """The device files (and CUDA's device folders, such as /dev/nvidia-caps) a child may write."""
    found = []
    for name in sorted(os.listdir("/dev")):
        if name in _DEVICES or name.startswith(_DEVICE_PREFIXES):
            found.append(os.path.join("/dev", name))
    return found


def _worker_folders(scratch_dir: str) -> tuple[list[str], list[str]]:
    """The scratch directories of this worker's other children and the folders of other workers on this machine
    (hidden), and the two folders holding them (never readable whole, so those made after the child entered its
    sandbox are hidden too: a split folder's later entries fall under no rule)."""
    scratch = os.path.realpath(scratch_dir)
    root = scratch
    while root != "/" and not os.path.basename(root).startswith(_WORKER_PREFIX):
        root = os.path.dirname(root)
    if root == "/":
        return [], []
    found = [os.path.join(root, n) for n in os.listdir(root) if n.startswith(_CHILD_PREFIXES)]
    parent = os.path.dirname(root)
    found += [os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(_WORKER_PREFIX)]
    # its own scratch directory (and, for memcheck's process, the child's it lies in) and worker stay readable
    return [p for p in found if not _beneath(scratch, p) and p != root], [root, parent]


def _hidden_places(home: str, others: list[str]) -> list[str]:
    """The places whose files a child may not read, as real paths: ``_HIDDEN``, the worker's HOME and its user's,
    and ``others`` (other children's and workers' folders)."""
    places = list(_HIDDEN) + others
    try:
        places.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    places.append(home)
    real = {os.path.realpath(p) for p in places if p and os.path.exists(p)}
    return sorted(p for p in real if p != "/")


def _needed(policy: SandboxPolicy) -> list[str]:
    """What a child must read wherever it lies: the Python installation and every folder it imports from, the
    folders of packages already imported (editable installs), the tools and libraries the environment names,
    the tasks folder, the scratch directory and the GPU lock."""
    paths = [policy.scratch_dir, policy.triton_cache_dir, *policy.readable, sys.prefix, sys.base_prefix,
             sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable), *sys.path]
    for name, module in list(sys.modules.items()):
        if "." in name or module is None:
            continue
        paths += list(getattr(module, "__path__", None) or []) or [getattr(module, "__file__", None) or ""]
    paths += [os.environ.get(v, "") for v in _TOOL_VARIABLES]
    for v in _TOOL_PATH_VARIABLES:
        paths += os.environ.get(v, "").split(os.pathsep)
    try:
        from kernelcast.kernels.formats import tasks_dir  # the imported tasks, on disk (``KERNELCAST_TASKS``)

        paths.append(str(tasks_dir()))
    except Exception:  # noqa: BLE001 - a checkout without the formats package: no tasks to read
        pass
    paths.append(os.path.join(os.path.dirname(policy.scratch_dir), "gpu.lock"))  # the worker's own lock
    return [p for p in paths if p and os.path.isabs(p)]


def _read_rules(hidden: list[str], needed: list[str], split: list[str] = ()) -> list[str]:
    """The paths under which reading is allowed: everything but ``hidden``, as Landlock (which only allows) needs
    it said, plus what of ``needed`` lies in a hidden place. A folder on the way to a hidden place, or in ``split``,
    is split into its entries; a path that is, holds or leads to a hidden place is never allowed whole."""
    def clear(real: str) -> bool:
        return not any(_beneath(real, h) or _beneath(h, real) for h in hidden) \
            and not any(_beneath(f, real) for f in split)

    rules: list[str] = []

    def visit(folder: str) -> None:
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            if clear(real):
                rules.append(path)
            elif not any(_beneath(real, h) for h in hidden) and os.path.isdir(path) and not os.path.islink(path):
                visit(path)

    visit("/")
    for path in needed:
        real = os.path.realpath(path)
        if os.path.exists(real) and any(_beneath(real, h) for h in hidden) and not any(real == h for h in hidden):
            rules.append(real)
    return rules


def _landlock(rules: dict[str, int], abi: int, reads: bool) -> list[str]:
    """Restrict writes (and with ``reads``, reading files) to ``rules`` (path -> the rights allowed beneath it);
    returns what else the ruleset refuses."""
    fs = _FS_WRITE_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0) \
        | (_FS_READ_FILE if reads else 0)
    file_rights = _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    attr_buf = ctypes.create_string_buffer(attr[:size], size)
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr_buf, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _oserror("landlock_create_ruleset")
    try:
        for path, rights in rules.items():
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone since it was listed, or a dangling link: nothing to allow
            try:
                allowed = rights & fs if os.path.isdir(f"/proc/self/fd/{fd}") else rights & fs & file_rights
                if not allowed:
                    continue
                rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
                if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                                 rule, ctypes.c_uint32(0)) != 0 and allowed & ~_FS_READ_FILE:
                    raise _oserror(f"landlock_add_rule({path})")  # a read refused (a pipe, /dev/stderr) stays refused
            finally:
                os.close(fd)
        _no_new_privs()
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _oserror("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return (["tcp"] if net else []) + (["signals", "abstract-unix"] if scoped else [])


def _drop_capabilities() -> str:
    """Drop every capability this process holds, and those an exec could give it back; returns "none" or why not.

    Without them a root child is an ordinary process of uid 0: it cannot read the /proc/<pid>/environ or mem of a
    process that holds capabilities (any root process) or is non-dumpable (the worker), nor override file modes."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails without CAP_SETPCAP, when there is nothing to drop
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: zero, both 32-bit halves
    if _libc.capset(header, data) != 0:
        return f"kept: capset: {os.strerror(ctypes.get_errno())}"
    with open("/proc/self/status") as f:
        held = {k: v.strip() for k, v in (line.split(":", 1) for line in f if line.startswith("Cap"))}
    if any(int(held.get(k, "0"), 16) for k in ("CapEff", "CapPrm", "CapAmb")):
        return "kept: " + ", ".join(f"{k}={held[k]}" for k in ("CapEff", "CapPrm", "CapAmb"))
    return "none"


def exposed_environments() -> list[str]:
    """Every process whose start-up environment this process can read and which holds a credential-looking
    variable, this process included: "<pid> (<command>): NAME, ...". /proc/<pid>/environ keeps the environment a
    process was started with, whatever it deleted since."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                items = f.read().split(b"\0")
        except OSError:
            continue
        names = sorted({item.split(b"=", 1)[0].decode(errors="replace") for item in items if b"=" in item}
                       - {""})
        secret = [n for n in names if is_secret_name(n)]
        if secret:
            try:
                with open(f"/proc/{entry}/comm") as f:
                    command = f.read().strip()
            except OSError:
                command = "?"
            found.append(f"{entry} ({command}): {', '.join(secret)}")
    return found


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
    """Apply every layer of ``policy`` to this process (irreversibly) and report what took effect.

    Raises ``SandboxError`` when, confined, it can still read an environment holding a credential-looking variable
    and the policy says to refuse (the default): the candidate is then never loaded."""
    global _confined_to, _hidden
    home = os.environ.get("HOME", "")  # the worker's, before it points into the scratch directory
    scrubbed = scrub_environment()
    os.setpgrp()  # its own process group, so the worker can kill whatever it forks along with it
    # Whatever it forks stays its descendant even when the parent between them exits (a daemon's double fork): the
    # verification asks whether the child has processes of its own (kernelcast.kernels.harness.verify.own_processes).
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    os.chdir(policy.scratch_dir)
    # The Triton cache (and CUDA's JIT cache) in the scratch directory: one children shared would let one plant a
    # compiled kernel under the key of another's source. Each child compiles its kernels and Triton's launchers anew.
    private_cache = os.path.join(policy.scratch_dir, "triton-cache")
    os.environ.update(HOME=policy.scratch_dir, TMPDIR=policy.scratch_dir, TRITON_HOME=policy.scratch_dir,
                      TRITON_CACHE_DIR=private_cache, CUDA_CACHE_PATH=os.path.join(policy.scratch_dir, "nv"),
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

    network, ipc = "off", "shared"
    for choice in NETWORK_CHOICES[NETWORK_CHOICES.index(policy.network):]:
        if choice == "off":
            break
        try:
            if choice == "namespace":
                ipc = "namespace" if _enter_network_namespace() else ipc
            else:
                if _libc.unshare(ctypes.c_int(_CLONE_NEWIPC)) == 0:  # needs CAP_SYS_ADMIN: a root child
                    ipc = "namespace"
                _refuse_sockets(refuse_ipc=ipc == "shared")
                ipc = "seccomp" if ipc == "shared" else ipc
            network = choice
            break
        except OSError as exc:
            notes.append(f"{choice} unavailable: {exc.strerror or exc}")
    if ipc == "shared" and _libc.unshare(ctypes.c_int(_CLONE_NEWIPC)) == 0:
        ipc = "namespace"
    keyrings = "refused" if network == "seccomp" else "shared"
    if network == "namespace":  # the keyrings alone: the session keyring it inherits is the worker's
        try:
            _refuse_sockets(sockets=False)
            keyrings = "refused"
        except OSError as exc:
            notes.append(f"keyrings shared: {exc.strerror or exc}")

    filesystem, writes, reads = "off", "anywhere", "all"
    if policy.filesystem == "landlock":
        abi = landlock_abi()
        if abi <= 0:
            notes.append("landlock unavailable: writes are confined only by the working directory and TMPDIR")
        else:
            # The CUDA driver writes into its own process's /proc entries while it initialises
            # (measured: without write access beneath /proc/<pid>, cudaGetDeviceCount fails with
            # error 304); the entries of other processes stay read-only.
            own_proc = f"/proc/{os.getpid()}" if policy.gpu else ""
            writable = [p for p in (policy.scratch_dir, own_proc) if p and os.path.isdir(p)]
            others, split = _worker_folders(policy.scratch_dir)
            hidden = _hidden_places(home, others)
            everything = (1 << 64) - 1  # masked to the handled rights by _landlock
            rules = {p: _FS_READ_FILE for p in _read_rules(hidden, _needed(policy), split)}
            rules.update({p: _FS_WRITE_FILE | _FS_TRUNCATE | _FS_READ_FILE for p in _devices()})
            rules.update({p: everything for p in writable})
            try:
                extra = _landlock(rules, abi, reads=True)
                _confined_to = tuple(os.path.realpath(p) for p in writable)
                _hidden = tuple(hidden)
                filesystem = f"landlock-abi{abi}"
                if extra:
                    filesystem += "+" + "+".join(extra)
                writes = "scratch+devices" + ("+own-proc" if own_proc else "")
                reads = "all-but:" + ",".join([h for h in hidden if h not in others]
                                              + (["other-children"] if split else []))
            except OSError as exc:
                notes.append(f"landlock failed: {exc.strerror or exc}")
    capabilities = _drop_capabilities()

    exposed = exposed_environments()
    environments = "exposed: " + "; ".join(exposed) if exposed else "hidden"
    report = SandboxReport(network=network, filesystem=filesystem, limits=tuple(limits), scrubbed=scrubbed,
                           notes=tuple(notes), ipc=ipc, keyrings=keyrings, writes=writes, reads=reads, capabilities=capabilities,
                           environments=environments, triton_cache="private")
    if exposed and policy.exposed_environments == "refuse":
        raise SandboxError(f"the sandbox refuses to load the candidate: the environment of process {exposed[0]} is "
                           f"readable from the child ({report.summary()}); a user namespace or Landlock would hide it: "
                           f"measure where one works, or keep credentials out of the environments of the worker's "
                           f"user's processes (docs/harness.md, 'What a child can read and write')")
    return report
