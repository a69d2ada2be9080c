"""The links of the emulated cluster as TCP sees them (docs/testing.md,
"The emulated cluster"): run on two ranks, one per node,

    bench/cluster.sh -n 2 -m 1 -r 1gbit -d 100 python3 bench/cluster_probe.py [NODE0_ADDRESS]

rank 0 listens on node 0's address (default 10.77.0.1, bench/cluster.sh's
first node), rank 1 connects from node 1 and measures the round trip of one
byte (TCP_NODELAY; 2000 times after 100 untimed) and the rate of 256 MiB sent
one way, as payload per second from the first byte received to the last.
Prints both on rank 1. No MPI: the rank comes from Open MPI's environment."""
import os
import socket
import statistics
import sys
import time

PORT = 5599
TRIPS, WARM = 2000, 100
BULK = 256 << 20


def main():
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    addr = sys.argv[1] if len(sys.argv) > 1 else "10.77.0.1"
    if rank == 0:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr, PORT))
        srv.listen(1)
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(TRIPS + WARM):
            conn.recv(1)
            conn.sendall(b"x")
        got, buf, start = 0, bytearray(1 << 20), None
        while got < BULK:
            n = conn.recv_into(buf)
            if n == 0:
                raise SystemExit("cluster_probe: the sender went away")
            start = start or time.perf_counter()
            got += n
        seconds = time.perf_counter() - start
        conn.sendall(f"{got / seconds / 1e6:.1f}".encode())
        conn.close()
    elif rank == 1:
        for _ in range(200):  # rank 0 may not listen yet
            try:
                conn = socket.create_connection((addr, PORT))
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit(f"cluster_probe: cannot connect to {addr}:{PORT}")
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtt = []
        for i in range(TRIPS + WARM):
            t = time.perf_counter()
            conn.sendall(b"x")
            conn.recv(1)
            if i >= WARM:
                rtt.append((time.perf_counter() - t) * 1e6)
        rtt.sort()
        chunk = bytes(1 << 20)
        for _ in range(BULK >> 20):
            conn.sendall(chunk)
        rate = conn.recv(64).decode()
        print(f"{socket.gethostname()} -> {addr}: 1-byte TCP round trip median "
              f"{statistics.median(rtt):.0f} us (p10 {rtt[TRIPS // 10]:.0f}, p90 "
              f"{rtt[9 * TRIPS // 10]:.0f}, {TRIPS} times); 256 MiB one way: {rate} MB/s "
              "of payload")


if __name__ == "__main__":
    main()
