"""Does a link carry both directions at once? Two nodes of bench/netlab.py
joined by a shaped link (default 1 Gbit/s), measured three ways:

    sudo python bench/netlab_duplex.py [--gbit 1] [--mib 8]

- raw TCP: one socket, one direction, then both directions at once;
- gloo: one all_to_all of MIB per peer, then the same bytes as 16
  all_to_alls in flight at once (as the chunked algorithms issue them).

Times are medians; "wire" is the bytes of one direction over the rate. The
result explains why fp8comm's algorithms run in chunks (DESIGN.md,
"Algorithms"): one large gloo message moves the two directions in turn.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netlab  # noqa: E402

PORT = 29411


def tcp_side(role: str, peer: str, nbytes: int) -> None:
    """One end of the raw-TCP measurement; the server prints the times."""
    if role == "server":
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", PORT))
        listener.listen(1)
        conn, _ = listener.accept()
    else:
        for _ in range(100):
            try:
                conn = socket.create_connection((peer, PORT))
                break
            except OSError:
                time.sleep(0.1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = os.urandom(nbytes)

    def receive(n):
        got = 0
        while got < n:
            got += len(conn.recv(min(1 << 20, n - got)))

    times = {"one direction": [], "both directions": []}
    for _ in range(3):
        for mode in times:
            conn.sendall(b"x")
            receive(1)
            t0 = time.perf_counter()
            if mode == "one direction":
                if role == "server":
                    conn.sendall(payload)
                    receive(1)
                else:
                    receive(nbytes)
                    conn.sendall(b"k")
            else:
                sender = threading.Thread(target=conn.sendall, args=(payload,))
                sender.start()
                receive(nbytes)
                sender.join()
            times[mode].append(time.perf_counter() - t0)
    if role == "server":
        for mode, ts in times.items():
            print(f"DUPLEX raw TCP, {mode}: {statistics.median(ts) * 1e3:.0f} ms", flush=True)


def gloo_rank(nbytes: int) -> None:
    """Run under torchrun on both nodes: one all_to_all vs 16 in flight."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    send = torch.randint(0, 255, (world * nbytes,), dtype=torch.uint8)
    recv = torch.empty_like(send)

    def timed(fn, reps=5):
        ts = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    one = timed(lambda: dist.all_to_all_single(recv, send, [nbytes] * world, [nbytes] * world))
    k = 16
    part = nbytes // k
    sends = [torch.cat([send[p * nbytes + i * part:p * nbytes + (i + 1) * part] for p in range(world)])
             for i in range(k)]
    recvs = [torch.empty(world * part, dtype=torch.uint8) for _ in range(k)]

    def many():
        works = [dist.all_to_all_single(recvs[i], sends[i], [part] * world, [part] * world, async_op=True)
                 for i in range(k)]
        for w in works:
            w.wait()

    sixteen = timed(many)
    if dist.get_rank() == 0:
        print(f"DUPLEX gloo, one all_to_all: {one:.0f} ms", flush=True)
        print(f"DUPLEX gloo, {k} all_to_alls in flight: {sixteen:.0f} ms", flush=True)
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gbit", type=float, default=1.0)
    p.add_argument("--mib", type=int, default=8, help="bytes each node sends, in MiB")
    p.add_argument("--role", help=argparse.SUPPRESS)
    p.add_argument("--peer", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    nbytes = args.mib << 20
    if args.role == "gloo":
        gloo_rank(nbytes)
        return 0
    if args.role:
        tcp_side(args.role, args.peer, nbytes)
        return 0
    reason = netlab.why_no_namespaces()
    if reason is not None:
        print(f"netlab_duplex: skipped, {reason}")
        return 0
    lab = netlab.Lab(2, 1500)
    try:
        lab.build()
        lab.shape(args.gbit, 0.0)
        me = [sys.executable, os.path.abspath(__file__), "--mib", str(args.mib)]
        server = subprocess.Popen(["ip", "netns", "exec", lab.nodes[0], *me, "--role", "server", "--peer", "-"],
                                  stdout=subprocess.PIPE, text=True)
        client = subprocess.Popen(["ip", "netns", "exec", lab.nodes[1], *me, "--role", "client",
                                   "--peer", lab.address(0)])
        tcp = server.communicate(timeout=300)[0]
        client.wait(timeout=60)
        gloo = netlab.launch(lab, 1, [os.path.abspath(__file__), "--mib", str(args.mib), "--role", "gloo"], {}, 600)
    finally:
        lab.close()
    wire = nbytes * 8 / (args.gbit * 1e9) * 1e3
    print(f"netlab_duplex: 2 nodes, {args.gbit:g} Gbit/s each way, {args.mib} MiB each way (wire {wire:.0f} ms)")
    for line in (tcp + gloo[0]).splitlines():
        if line.startswith("DUPLEX"):
            print("  " + line.removeprefix("DUPLEX "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
