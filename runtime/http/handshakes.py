"""A listener that stops taking new TCP handshakes but keeps the ones under way, so a
drain can accept every connection the kernel completed before it closes the listener.

Closing a listening socket resets the connections still in its accept queue: a client
whose handshake completed there has sent its request and gets a reset for an answer.
Accepting what is queued and then closing leaves a gap in which another handshake can
complete unseen (found on a loaded machine: one client in a few hundred reset). So the
drain first attaches a classic BPF filter that drops the SYNs reaching the listener:
no handshake starts after it, the ones under way complete (their ACKs pass), and a
client sending a SYN retransmits it after a second, when the closed port refuses it,
which loses nothing. Linux only; elsewhere the drain goes on without it.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import struct

log = logging.getLogger(__name__)

SO_ATTACH_FILTER = 26
_TCP_FLAGS_OFFSET = 13
"""A TCP socket's filter sees the segment from its TCP header; the flags are byte 13."""
_SYN, _ACK = 0x02, 0x10

_BPF_LD_B_ABS, _BPF_ALU_AND_K, _BPF_JMP_JEQ_K, _BPF_RET_K = 0x30, 0x54, 0x15, 0x06
_DROP_SYNS = (
    (_BPF_LD_B_ABS, 0, 0, _TCP_FLAGS_OFFSET),
    (_BPF_ALU_AND_K, 0, 0, _SYN | _ACK),
    (_BPF_JMP_JEQ_K, 0, 1, _SYN),  # a SYN without ACK: a new handshake
    (_BPF_RET_K, 0, 0, 0),  # dropped
    (_BPF_RET_K, 0, 0, 0xFFFFFFFF),  # kept whole
)


def refuse_new_handshakes(sock: socket.socket) -> bool:
    """Drops every SYN that reaches the listening `sock` from now on; True if the filter
    is attached (False where the system refuses it, which the log says)."""
    program = b"".join(struct.pack("HBBI", *instruction) for instruction in _DROP_SYNS)
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HL", len(_DROP_SYNS), ctypes.addressof(buffer))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError as error:
        log.warning("Could not stop new handshakes before closing the listener: %s", error)
        return False
    return True
