"""What one TCP receive stamp covers: the experiment behind harness/client/stamped_http.py's read design.

A sender writes three segments 3 ms apart over loopback (TCP_NODELAY); the receiver (SO_TIMESTAMPNS) reads
only after all three arrived, either in one recvmsg or one segment's length at a time. On Linux the one read
carries the newest segment's time, and reading segment by segment does not bring the older times back: a
segment that arrives while unread data waits is merged into the queued one (tcp_try_coalesce), which keeps
the newer time. So bounded reads cannot stamp events the loop was late for; only reading in time can.

    python benchmarks/rx_timestamp_probe.py
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.client.stamped_http import ANCILLARY_BYTES, SO_TIMESTAMPNS

SEGMENT_BYTES, GAP_S = 200, 0.003


def late_reads(one_by_one: bool) -> tuple[list[int], list[int]]:
    """(CLOCK_REALTIME ns each segment was sent, the stamp of each read)."""
    listener = socket.create_server(("127.0.0.1", 0))
    receiver = socket.create_connection(listener.getsockname())
    receiver.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sender, _ = listener.accept()
    listener.close()
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent = []
    for i in range(3):
        sent.append(time.time_ns())
        sender.send(bytes([65 + i]) * SEGMENT_BYTES)
        time.sleep(GAP_S)
    time.sleep(0.01)  # the reader is late: all three wait in the socket
    stamps = []
    for _ in range(3 if one_by_one else 1):
        _, ancillary, _, _ = receiver.recvmsg(SEGMENT_BYTES if one_by_one else 65536, ANCILLARY_BYTES)
        sec, nsec = struct.unpack_from("qq", ancillary[0][2])
        stamps.append(sec * 1_000_000_000 + nsec)
    sender.close()
    receiver.close()
    return sent, stamps


def main() -> None:
    for one_by_one in (False, True):
        sent, stamps = late_reads(one_by_one)
        print(
            f"{'segment by segment' if one_by_one else 'one read':>18}: sent at "
            + ", ".join(f"{(t - sent[0]) / 1e6:.2f}" for t in sent)
            + " ms; read stamps "
            + ", ".join(f"{(t - sent[0]) / 1e6:.2f}" for t in stamps)
            + " ms"
        )


if __name__ == "__main__":
    main()
