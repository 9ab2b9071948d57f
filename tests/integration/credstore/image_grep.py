#!/usr/bin/env python3
"""Counts needles in files as their bytes are, not as they are stored (credstore.c's leak proof).

  image_grep.py FILE...      needles on stdin, one per line (never on the command line, which
                             the host's ps shows); prints "needle <i> <count>" per needle, then
                             "file <path> <format> <decoded bytes>" per file, then "total
                             <files> files <bytes> bytes". Exit 2 on a file
                             it cannot decode: an unread image proves nothing.

Decoded, in this order:
  - zstd (the worker's artifacts, *.zst): through `zstd -dc`;
  - a gVisor state file (runsc checkpoint's checkpoint.img, the guest's memory and the kernel's
    objects): the 8-byte magic "gVisorSF", an 8-byte big-endian length and that much JSON
    metadata, then gVisor's compressio stream (pkg/compressio, pkg/state/statefile): a 4-byte
    chunk size, then chunks of a 4-byte length and that many bytes of raw DEFLATE; with a key
    32-byte HMACs between them (this runsc: one after the metadata only). Metadata
    "compression": "none" (newer runsc) stores the chunks uncompressed;
  - /proc/PID/mem: the process' readable mappings (/proc/PID/maps), but runsc's memory file
    (given as its /proc/PID/fd/N instead, a sparse file like the next);
  - anything else (a btrfs send stream: file data as written, a log, a table, a disk image):
    as it is, its holes skipped.
A needle split across two chunks is found: the search keeps the tail of the previous block.
"""
import json
import os
import struct
import subprocess
import sys
import zlib

MAGIC = b"gVisorSF"
BLOCK = 1 << 20


class Counter:
    def __init__(self, needles):
        self.needles = needles
        self.counts = [0] * len(needles)
        self.keep = max((len(n) for n in needles), default=1) - 1
        self.tail = b""
        self.total = 0

    def feed(self, data):
        if not data:
            return
        self.total += len(data)
        buf = self.tail + data
        for i, n in enumerate(self.needles):
            # Matches that end inside the new bytes only (the tail was counted before).
            start = 0
            while True:
                j = buf.find(n, start)
                if j < 0:
                    break
                if j + len(n) > len(self.tail):
                    self.counts[i] += 1
                start = j + 1
        self.tail = buf[-self.keep:] if self.keep else b""


def read_exact(f, n):
    b = f.read(n)
    if len(b) != n:
        raise ValueError("truncated")
    return b


def chunks(d, off, chunk_hash, each_hash, compressed):
    """The decoded chunks of a compressio stream in d from off, or ValueError."""
    out = []
    (chunk,) = struct.unpack(">I", d[off:off + 4])
    if chunk == 0 or chunk > 64 << 20 or chunk & (chunk - 1):
        raise ValueError("bad chunk size")
    off += 4 + (32 if chunk_hash else 0)
    while off < len(d):
        if off + 4 > len(d):
            raise ValueError("truncated chunk header")
        (n,) = struct.unpack(">I", d[off:off + 4])
        off += 4
        if n > 2 * chunk + 1024 or off + n > len(d):
            raise ValueError("chunk longer than its size")
        data = d[off:off + n]
        off += n + (32 if each_hash else 0)
        try:
            out.append(zlib.decompress(data, -15) if compressed else data)
        except zlib.error as e:
            raise ValueError(str(e)) from e
    return out


def state_file(f, c):
    """The gVisor state file after its magic (already read)."""
    (mlen,) = struct.unpack(">Q", read_exact(f, 8))
    if mlen > 16 << 20:
        raise ValueError("metadata too long")
    meta = json.loads(read_exact(f, mlen))
    c.feed(json.dumps(meta).encode())
    compressed = meta.get("compression", "flate-best-speed") != "none"
    d = f.read()
    # Where HMAC-SHA256s sit depends on the key runsc gives (statefile: after the metadata;
    # compressio: after the chunk size and each chunk). This runsc (2022-12) writes the
    # metadata's and no chunk's. The layout that decodes to its end wins.
    why = None
    for meta_hash, chunk_hash, each_hash in ((True, False, False), (False, False, False),
                                             (True, True, True), (False, True, True)):
        try:
            out = chunks(d, 32 if meta_hash else 0, chunk_hash, each_hash, compressed)
        except (ValueError, struct.error) as e:
            why = e
            continue
        for b in out:
            c.feed(b)
        return
    raise ValueError("no compressio layout decodes: %s" % why)


def process_memory(path, c):
    """/proc/PID/mem: every readable mapping in /proc/PID/maps but the guest's memory file
    (runsc's memfd, read through its fd instead: its mappings are mostly holes, which a read
    through mem would fill) and what the kernel does not let one read."""
    maps = os.path.join(os.path.dirname(path), "maps")
    fd = os.open(path, os.O_RDONLY)
    try:
        with open(maps) as m:
            regions = [l.split() for l in m]
        for r in regions:
            lo, hi = (int(x, 16) for x in r[0].split("-"))
            name = " ".join(r[5:]) if len(r) > 5 else ""
            if r[1][0] != "r" or "runsc-memory" in name or name in ("[vvar]", "[vsyscall]"):
                continue
            c.tail = b""
            off = lo
            while off < hi:
                try:
                    b = os.pread(fd, min(BLOCK, hi - off), off)
                except OSError:
                    break
                if not b:
                    break
                c.feed(b)
                off += len(b)
    finally:
        os.close(fd)


def scan(path, c):
    before = c.total
    if path.startswith("/proc/") and path.endswith("/mem"):
        process_memory(path, c)
        return "process-memory", c.total - before
    proc = None
    if path.endswith(".zst"):
        proc = subprocess.Popen(["zstd", "-dc", path], stdout=subprocess.PIPE)
        f = proc.stdout
        fmt = "zstd"
    else:
        f = open(path, "rb")
        fmt = "raw"
    c.tail = b""
    try:
        head = f.read(len(MAGIC))
        if head == MAGIC:
            fmt += "+gvisor-state"
            state_file(f, c)
        elif proc:
            c.feed(head)
            while True:
                b = f.read(BLOCK)
                if not b:
                    break
                c.feed(b)
        else:
            # Only the file's data: a sparse image (the worker's btrfs volume) is mostly holes,
            # which hold zeros and so no needle.
            fd = f.fileno()
            end = os.fstat(fd).st_size
            off = 0
            while off < end:
                try:
                    off = os.lseek(fd, off, os.SEEK_DATA)
                except OSError:
                    break  # no data after off
                hole = os.lseek(fd, off, os.SEEK_HOLE)
                c.tail = b""
                os.lseek(fd, off, os.SEEK_SET)
                while off < hole:
                    b = os.read(fd, min(BLOCK, hole - off))
                    if not b:
                        break
                    c.feed(b)
                    off += len(b)
    finally:
        f.close()
        if proc and proc.wait() != 0:
            raise ValueError("zstd failed")
    return fmt, c.total - before


def main():
    needles = [l.rstrip("\n").encode() for l in sys.stdin if l.rstrip("\n")]
    if not needles:
        print("no needles on stdin", file=sys.stderr)
        return 2
    c = Counter(needles)
    rc = 0
    lines = []
    for path in sys.argv[1:]:
        try:
            fmt, n = scan(path, c)
            lines.append("file %s %s %d" % (path, fmt, n))
        except FileNotFoundError:
            lines.append("file %s gone" % path)  # a daemon removed it meanwhile
        except (OSError, ValueError, zlib.error) as e:
            lines.append("file %s error %s" % (path, e))
            rc = 2
    for i, n in enumerate(c.counts):
        print("needle %d %d" % (i, n))
    for l in lines:
        print(l)
    print("total %d files %d bytes" % (len(lines), c.total))
    return rc


if __name__ == "__main__":
    sys.exit(main())
