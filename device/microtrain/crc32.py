# CRC-32 (IEEE, as zlib and binascii compute it). binascii.crc32 where the port has it,
# a pure-Python bitwise fallback elsewhere (slow but only run once per file).
try:
    from binascii import crc32
except ImportError:
    crc32 = None

if crc32 is None:
    def crc32(data, crc=0):
        if not isinstance(data, (bytes, bytearray)):
            data = bytes(data)      # a view of an arena: its raw bytes, not its elements
        crc ^= 0xFFFFFFFF
        for byte in data:
            crc ^= byte
            for _ in range(8):
                crc = (crc >> 1) ^ (0xEDB88320 & -(crc & 1))
        return crc ^ 0xFFFFFFFF
