"""The wire protocol both sides speak: frames, the request/reply protocol, and the serial link.

framing.py     length-prefixed frames (JSON header + raw body) over any byte channel
protocol.py    request/reply messages, error codes, a blocking client
cobs.py        COBS byte stuffing for the serial line
serial_link.py reliable sessions over serial: COBS packets with CRC32, seq numbers, ACK/retry
tty.py         the board's raw serial port (standard library termios)
"""

from .framing import ConnectionClosed, FrameStream, PipeChannel, ProtocolError, encode_frame
from .protocol import PROTOCOL_VERSION, Client, RemoteError

__all__ = ["ConnectionClosed", "FrameStream", "PipeChannel", "ProtocolError", "encode_frame",
           "PROTOCOL_VERSION", "Client", "RemoteError"]
