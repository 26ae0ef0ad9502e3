"""A userspace ``netem``: forwards Ethernet frames between two interfaces, each
delayed by a fixed time, a fraction of them dropped.

``python -m tests.netns.wire IF1 IF2 --delay-ms 50 --loss 5`` runs (inside the
lab's hub namespace) until killed. The kernels of small VMs (this one included)
often lack ``sch_netem`` and every ``tc`` classifier/action, so
:meth:`tests.netns.lab.Lab.degrade` takes the host's port out of the bridge and
puts this forwarder between it and a new bridge port instead.

Frames are read with ``AF_PACKET`` raw sockets (frames this process sent itself
come back as ``PACKET_OUTGOING`` and are skipped). A veth leaves the TCP/UDP
checksum of a frame for "the hardware" to fill in; a frame read here and written
again would arrive with that placeholder and be dropped, so the wire computes
the checksum of every IPv4 TCP/UDP frame (:func:`fix_checksum`). Frames are kept in one FIFO per direction
(the delay is fixed, so FIFO order is due order) and written to the other side
when due. Drops are independent per frame, per direction (``random.random``).
"""

from __future__ import annotations

import argparse
import array
import collections
import random
import select
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
_IPV4 = b"\x08\x00"
#: IP protocol -> offset of the checksum in its header.
_CSUM_AT = {6: 16, 17: 6}


def fix_checksum(frame: bytes) -> bytes:
    """``frame`` with the TCP or UDP checksum of its IPv4 packet computed (RFC 1071);
    any other frame unchanged."""
    if frame[12:14] != _IPV4 or len(frame) < 34:
        return frame
    ihl = (frame[14] & 0x0F) * 4
    proto = frame[23]
    at = _CSUM_AT.get(proto)
    total = struct.unpack_from("!H", frame, 16)[0]
    start, end = 14 + ihl, 14 + total
    if at is None or end > len(frame) or end - start < at + 2:
        return frame
    out = bytearray(frame)
    out[start + at : start + at + 2] = b"\0\0"
    segment = bytes(out[start:end])
    pseudo = frame[26:34] + struct.pack("!BBH", 0, proto, end - start)
    data = pseudo + segment + (b"\0" if len(segment) % 2 else b"")
    # Summing native-order words and storing the result in native order gives the
    # right bytes either way (RFC 1071's byte-order independence).
    total_sum = sum(array.array("H", data))
    while total_sum >> 16:
        total_sum = (total_sum & 0xFFFF) + (total_sum >> 16)
    checksum = ~total_sum & 0xFFFF
    if checksum == 0 and proto == 17:
        checksum = 0xFFFF
    out[start + at : start + at + 2] = checksum.to_bytes(2, sys.byteorder)
    return bytes(out)


def _open(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((ifname, 0))
    sock.setblocking(False)
    return sock


def forward(if1: str, if2: str, delay_s: float, loss: float) -> None:
    """Forward frames both ways between ``if1`` and ``if2`` forever."""
    a, b = _open(if1), _open(if2)
    other = {a: b, b: a}
    queue: collections.deque[tuple[float, socket.socket, bytes]] = collections.deque()
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
        ready, _, _ = select.select([a, b], [], [], timeout)
        now = time.monotonic()
        for sock in ready:
            while True:
                try:
                    frame, addr = sock.recvfrom(65_535)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING or random.random() < loss:
                    continue
                queue.append((now + delay_s, other[sock], fix_checksum(frame)))
        while queue and queue[0][0] <= now:
            _, out, frame = queue.popleft()
            try:
                out.send(frame)
            except OSError:  # a full queue or a link going away: the frame is lost
                pass


def main() -> None:
    """Parse the command line and forward."""
    parser = argparse.ArgumentParser()
    parser.add_argument("if1")
    parser.add_argument("if2")
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--loss", type=float, default=5.0, help="percent of frames dropped")
    args = parser.parse_args()
    forward(args.if1, args.if2, args.delay_ms / 1000, args.loss / 100)


if __name__ == "__main__":
    main()
