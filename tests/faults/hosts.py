"""Hosts of a test's own on one machine: network namespaces, each joined to the machine by a veth pair.

A process started with :meth:`Host.command` runs with the namespace's network only: its own loopback and one
address (``10.77.<k>.2``), a default route to the machine's end of its link (``10.77.<k>.1``). Services the test
starts on the machine listen on :attr:`Hosts.service_address` (the first link's machine end), which every host
reaches through its own link, as hosts reach shared brokers and an object store over the network. What a
namespace does not separate (the filesystem, the kernel's file locks, pids) the test keeps apart itself: each
host gets a data directory of its own, as hosts have disks of their own.

Needs root and ``ip`` (iproute2): :func:`can_make_hosts` says whether this machine can.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator


def can_make_hosts() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Host:
    """One namespace: its name, its address, and how to run a command in it."""

    def __init__(self, namespace: str, address: str) -> None:
        self.namespace, self.address = namespace, address

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv]


class Hosts:
    """``count`` namespaces made on entry and removed (with their links) on exit."""

    def __init__(self, count: int) -> None:
        tag = uuid.uuid4().hex[:5]  # interface names hold 15 characters
        self._names = [(f"ss{tag}h{k}", f"ss{tag}v{k}", k) for k in range(1, count + 1)]
        self.hosts: list[Host] = []

    @property
    def service_address(self) -> str:
        """The machine's address every host reaches (the machine's end of the first link)."""
        return f"10.77.{self._names[0][2]}.1"

    def __enter__(self) -> list[Host]:
        try:
            for namespace, link, k in self._names:
                _ip("netns", "add", namespace)
                _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", namespace)
                _ip("addr", "add", f"10.77.{k}.1/24", "dev", link)
                _ip("link", "set", link, "up")
                inside = ["-n", namespace]
                _ip(*inside, "addr", "add", f"10.77.{k}.2/24", "dev", "eth0")
                _ip(*inside, "link", "set", "eth0", "up")
                _ip(*inside, "link", "set", "lo", "up")
                _ip(*inside, "route", "add", "default", "via", f"10.77.{k}.1")
                self.hosts.append(Host(namespace, f"10.77.{k}.2"))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.hosts

    def __exit__(self, *exc) -> None:
        for namespace, link, _k in self._names:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("link", "del", link)  # its peer goes with it
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", namespace)


@contextlib.contextmanager
def hosts(count: int) -> Iterator[tuple[Hosts, list[Host]]]:
    made = Hosts(count)
    with made as members:
        yield made, members
