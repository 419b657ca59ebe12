#!/usr/bin/env python3
"""Run one command in a small VM whose kernel has cgroup v2 alone (cpuset, memory, pids...).

Why a VM: this host is hybrid (cpuset, memory, pids and freezer are bound to v1 hierarchies),
and a controller bound to a v1 hierarchy is unusable by every cgroup2 mount of the same kernel,
so no container or namespace here can show a job's limits under cgroup v2. A guest kernel of
its own can (``cgroup_no_v1=all``).

Theory of operation. QEMU boots Debian's kernel (unpacked by scripts/setup/setup-vm.sh; started as
its ELF ``vmlinux`` at the PVH entry, which spares the emulated decompression) with an
initramfs built here: a static busybox, the modules for virtio, 9p and overlay, and our own
``init``. The init mounts the host's whole filesystem (9p, read-only) under a tmpfs overlay, so
the guest sees this checkout, its ``.venv`` and the host's Python, and may write anywhere
without touching the host; it mounts proc, sys, devtmpfs, a tmpfs ``/tmp`` and ``/run``, and
cgroup2 at ``/sys/fs/cgroup`` with every controller (cpuset, memory, pids...) enabled for the
root's children (as systemd does on a cgroup v2 host); it brings up loopback, runs the command
chrooted there (in the root cgroup, as root, leading a session of its own) with its output to
a second, writable 9p share, writes its exit status there and powers off. This script prints
that output and exits with that status.

KVM is used where the CPU has hardware virtualization; else TCG (the message says why). On the
Firecracker machines of this project /dev/kvm exists but is PVM (``kvm_pvm``: no vmx/svm), which
runs only guest kernels built for PVM: Debian's kernel did not get past SeaBIOS's "Booting from
ROM" in 120 s there, QEMU spinning in the host's kernel (this host's own kernel has
CONFIG_PVM_GUEST, but its image is nowhere on the machine).

Usage: scripts/quality/cgroup2_vm.py [--timeout S] [--cpus N] [--memory MIB] [--env K=V]... [--]
COMMAND... Run from the directory the command should run in (the same path in the guest).
Exit status: the command's; 124 when the timeout ended the VM; 125 when the VM could not run
the command (the console's last lines say why).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import hashlib
import lzma
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts import ROOT

CACHE = Path(os.environ.get("GBROKER_VM_CACHE", ROOT / ".venv" / ".cache" / "cgroup2-vm"))
BUSYBOX = Path("/bin/busybox")
TIMED_OUT = 124
VM_FAILED = 125
# The modules init loads, in this order after their dependencies (read from each module).
MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
# Kept in the guest: what a shell and Python need, and nothing of the caller's test run.
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONDONTWRITEBYTECODE")
# v1 off, so that every controller is cgroup2's; a random seed from the (emulated) CPU at once;
# the TSC kept as the clock (else the emulated HPET, a trap at each read of the time).
KERNEL_ARGS = "cgroup_no_v1=all random.trust_cpu=on tsc=reliable"
PR_SET_PDEATHSIG = 1

INIT = r"""#!/bin/busybox sh
# PID 1 of the cgroup v2 test VM: written by scripts/quality/cgroup2_vm.py (its docstring says why).
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "cgroup2-vm init: $*" >&2; poweroff -f; }
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev ||
    fail "cannot mount proc, sys, dev"
for module in $(cat /modules/order); do
    insmod "/modules/$module" || fail "insmod $module failed"
done
mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 hostroot /lower ||
    fail "cannot mount the host's root (9p)"
mount -t tmpfs -o mode=0755 tmpfs /upper && mkdir /upper/data /upper/work
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot ||
    fail "cannot mount the overlay on the host's root"
R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t cgroup2 -o nsdelegate cgroup2 $R/sys/fs/cgroup || fail "cannot mount cgroup2"
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
mkdir -p /xfer
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 xfer /xfer ||
    fail "cannot mount the output share (9p)"
# The command's directory under /tmp (a checkout there) stays reachable under the guest's own
# tmpfs /tmp: held aside, then moved back (through the overlay, so still writable).
KEEP=$(cat /xfer/keep 2>/dev/null)
if [ -n "$KEEP" ]; then
    mkdir -p /kept && mount -o bind "$R$KEEP" /kept || fail "cannot hold $KEEP aside"
fi
mount -t tmpfs -o mode=1777 tmpfs $R/tmp
if [ -n "$KEEP" ]; then
    mkdir -p "$R$KEEP" && mount -o move /kept "$R$KEEP" || fail "cannot bring $KEEP back"
fi
mount -t tmpfs -o mode=0755 tmpfs $R/run
mkdir $R/run/gbroker-vm
mount -o move /xfer $R/run/gbroker-vm || fail "cannot move the output share"
ip link set lo up
[ -f $R/etc/hostname ] && hostname "$(cat $R/etc/hostname)"
for controller in $(cat $R/sys/fs/cgroup/cgroup.controllers); do
    echo "+$controller" > $R/sys/fs/cgroup/cgroup.subtree_control
done
cat /proc/uptime > $R/run/gbroker-vm/started
# In a session of its own, as a login or a service would be: the kernel starts PID 1 in process
# group 0, which its children would otherwise keep (and os.getpgid(0) be 0 in the command).
setsid chroot $R /bin/sh /run/gbroker-vm/command </dev/null >$R/run/gbroker-vm/output 2>&1
echo $? > $R/run/gbroker-vm/status.new
mv $R/run/gbroker-vm/status.new $R/run/gbroker-vm/status
sync
poweroff -f
"""


def _say(message: str) -> None:
    print(f"cgroup2_vm: {message}", file=sys.stderr, flush=True)


def kernel() -> tuple[Path, Path]:
    """The cached kernel image and its modules' directory, after scripts/setup/setup-vm.sh where
    QEMU, busybox or the kernel is missing."""
    for attempt in range(2):
        images = sorted(CACHE.glob("kernel-*/boot/vmlinuz-*"))
        if images and BUSYBOX.exists() and shutil.which("qemu-system-x86_64"):
            image = images[-1]
            version = image.name.removeprefix("vmlinuz-")
            return _uncompressed(image), image.parent.parent / "lib" / "modules" / version
        if attempt == 0:
            subprocess.run(["bash", str(ROOT / "scripts" / "setup" / "setup-vm.sh")], check=True)
    raise SystemExit(
        f"cgroup2_vm: scripts/setup/setup-vm.sh left no QEMU, busybox or kernel ({CACHE})"
    )


def _uncompressed(image: Path) -> Path:
    """The kernel as an ELF file, unpacked once from its compressed image where it is xz's.

    Emulated, the kernel's own decompressor takes 12 s of the boot; QEMU starts the ELF
    ``vmlinux`` at its PVH entry point at once (Debian's kernels have CONFIG_PVH)."""
    target = image.with_name(image.name.replace("vmlinuz", "vmlinux", 1))
    if target.exists():
        return target
    data = image.read_bytes()
    start = data.find(b"\xfd7zXZ\x00")
    if start < 0:
        _say(f"{image.name} is not compressed with xz: booting it as it is (slower)")
        return image
    elf = lzma.LZMADecompressor().decompress(data[start:])
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_bytes(elf)
    os.replace(partial, target)
    return target


def _module_files(modules: Path) -> dict[str, Path]:
    """Each module's file by its name (dashes as underscores, as the kernel names them)."""
    files = {}
    for path in modules.rglob("*.ko*"):
        name = path.name.split(".ko")[0].replace("-", "_")
        files[name] = path
    return files


def _read_module(path: Path) -> bytes:
    data = path.read_bytes()
    return lzma.decompress(data) if path.suffix == ".xz" else data


def _load_order(modules: Path) -> list[tuple[str, bytes]]:
    """MODULES and every module they depend on, dependencies first; built-in ones left out."""
    files = _module_files(modules)
    builtin_list = modules / "modules.builtin"
    builtin = set()
    if builtin_list.exists():
        builtin = {
            Path(line).name.split(".ko")[0].replace("-", "_")
            for line in builtin_list.read_text().split()
        }
    order: list[tuple[str, bytes]] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name in builtin:
            return
        seen.add(name)
        if name not in files:
            raise SystemExit(f"cgroup2_vm: the kernel in {modules} has no module {name}")
        data = _read_module(files[name])
        found = re.search(rb"(?:^|\0)depends=([^\0]*)", data)
        for dependency in found.group(1).decode().split(",") if found else []:
            if dependency:
                visit(dependency.replace("-", "_"))
        order.append((f"{name}.ko", data))

    for name in MODULES:
        visit(name)
    return order


def initramfs(modules: Path) -> Path:
    """The guest's initramfs, built once per kernel, busybox and init (a cached file)."""
    order = _load_order(modules)
    digest = hashlib.sha256(INIT.encode())
    digest.update(BUSYBOX.read_bytes())
    for name, data in order:
        digest.update(name.encode() + data)
    target = CACHE / f"initramfs-{modules.name}-{digest.hexdigest()[:16]}.cpio.gz"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        tree = Path(work) / "tree"
        for directory in ("bin", "modules", "proc", "sys", "dev"):
            (tree / directory).mkdir(parents=True)
        shutil.copy2(BUSYBOX, tree / "bin" / "busybox")
        for name, data in order:
            (tree / "modules" / name).write_bytes(data)
        (tree / "modules" / "order").write_text("\n".join(name for name, _ in order) + "\n")
        (tree / "init").write_text(INIT)
        (tree / "init").chmod(0o755)
        members = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
        archive = Path(work) / "initramfs.cpio"
        with archive.open("wb") as out:
            subprocess.run(
                [str(BUSYBOX), "cpio", "-o", "-H", "newc"],
                input="\n".join(members).encode(),
                cwd=tree,
                stdout=out,
                stderr=subprocess.DEVNULL,
                check=True,
            )
        subprocess.run(["gzip", "-1", str(archive)], check=True)
        os.replace(f"{archive}.gz", target)
    for stale in CACHE.glob("initramfs-*.cpio.gz"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


def accelerator() -> tuple[str, str]:
    """("kvm" or "tcg", why): $GBROKER_VM_ACCEL decides where set."""
    chosen = os.environ.get("GBROKER_VM_ACCEL", "")
    if chosen:
        return chosen, "as GBROKER_VM_ACCEL says"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg", "no usable /dev/kvm: emulating the CPU (TCG), slower"
    flags = set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                flags.update(line.split(":", 1)[1].split())
                break
    if flags & {"vmx", "svm"}:
        return "kvm", "hardware virtualization"
    pvm = " (it is PVM, kvm_pvm, which runs only PVM-built guest kernels)"
    return "tcg", (
        "/dev/kvm is there but the CPU has no vmx/svm"
        + (pvm if Path("/sys/module/kvm_pvm").exists() else "")
        + ": emulating the CPU (TCG), slower"
    )


def _command_script(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    lines = [f"cd {shlex.quote(str(cwd))} || exit {VM_FAILED}"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    lines.append("exec " + shlex.join(argv))
    return "\n".join(lines) + "\n"


def _qemu(
    accel: str, cpus: int, memory_mib: int, initrd: Path, image: Path, xfer: Path
) -> list[str]:
    cpu = (
        ["-enable-kvm", "-cpu", "host"]
        if accel == "kvm"
        else ["-accel", "tcg,thread=multi", "-cpu", "max"]
    )
    share = "security_model=none"
    return [
        "qemu-system-x86_64", *cpu, "-smp", str(cpus), "-m", str(memory_mib),
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-serial", f"file:{xfer / 'console.log'}",
        "-kernel", str(image), "-initrd", str(initrd),
        "-append", f"console=ttyS0 panic=-1 quiet loglevel=4 {KERNEL_ARGS}",
        # The host's whole tree, read-only (its mounts are other devices: remap their inodes).
        "-virtfs", f"local,path=/,mount_tag=hostroot,readonly=on,multidevs=remap,{share}",
        "-virtfs", f"local,path={xfer},mount_tag=xfer,{share}",
    ]  # fmt: skip


def _die_with_parent() -> None:
    """In QEMU's child before exec: killed when this script dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def run(
    argv: list[str],
    *,
    timeout: float,
    cpus: int = 2,
    memory_mib: int = 1536,
    env: dict[str, str] | None = None,
) -> tuple[int, bytes, dict[str, float]]:
    """Run argv in the guest from the same directory: (exit status, its output, timings in
    seconds: "parts" to find or make the kernel and initramfs, "boot" from QEMU's start to the
    command's, "command", "total")."""
    started = time.monotonic()
    image, modules = kernel()
    initrd = initramfs(modules)
    timings = {"parts": time.monotonic() - started}
    accel, why = accelerator()
    _say(f"{accel} ({why}); {cpus} vCPUs, {memory_mib} MiB; kernel {modules.name}")
    guest_env = {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
    guest_env.update({"HOME": "/root", "TERM": "dumb", "GBROKER_CGROUP2_VM": "1"})
    guest_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="cgroup2-vm-") as shared:
        xfer = Path(shared)
        (xfer / "command").write_text(_command_script(argv, Path.cwd(), guest_env))
        if Path.cwd().is_relative_to("/tmp"):  # hidden by the guest's own /tmp otherwise
            (xfer / "keep").write_text(str(Path.cwd()))
        vm = subprocess.Popen(
            _qemu(accel, cpus, memory_mib, initrd, image, xfer),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        launched = time.monotonic()
        deadline = started + timeout
        try:
            while vm.poll() is None and time.monotonic() < deadline:
                if "boot" not in timings and (xfer / "started").exists():
                    timings["boot"] = time.monotonic() - launched
                with contextlib.suppress(subprocess.TimeoutExpired):
                    vm.wait(timeout=0.05)
        finally:
            if vm.poll() is None:
                vm.kill()
                vm.wait()
        timings["total"] = time.monotonic() - started
        if "boot" in timings:
            timings["command"] = time.monotonic() - launched - timings["boot"]
        output = (xfer / "output").read_bytes() if (xfer / "output").exists() else b""
        if (xfer / "status").exists():
            return int((xfer / "status").read_text()), output, timings
        if time.monotonic() >= deadline:
            _say(f"timed out after {timeout:g} s; the console's last lines:")
            status = TIMED_OUT
        else:
            _say(f"QEMU exited {vm.returncode} before the command ended; the console's last lines:")
            status = VM_FAILED
        console = xfer / "console.log"
        tail = console.read_text(errors="replace").splitlines()[-20:] if console.exists() else []
        for line in tail:
            print(f"  {line}", file=sys.stderr)
        return status, output, timings


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Run a command in a VM with cgroup v2 only (its output, then its status)."
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--cpus", type=int, default=2, help="vCPUs (default 2)")
    parser.add_argument("--memory", type=int, default=1536, help="MiB (default 1536)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="set in the guest"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the command to run in the guest is missing")
    env = {}
    for pair in args.env:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            parser.error(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    status, output, timings = run(
        command, timeout=args.timeout, cpus=args.cpus, memory_mib=args.memory, env=env
    )
    sys.stdout.buffer.write(output)
    sys.stdout.flush()
    shown = {key: f"{seconds:.1f} s" for key, seconds in timings.items()}
    _say(
        "kernel and initramfs ready in {parts}; the command started {boot} after QEMU did and "
        "took {command}; {total} in all".format_map(collections.defaultdict(lambda: "-", shown))
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
