"""Latency of the viewer's API as the page uses it: slider moves, test-image picks, uploads.

A segmentation or synthesis checkpoint has no sliders: its walks are timed instead, test inputs picked with the
page's defaults (synthesis: four noise seeds), with one capsule layer's routing (synthesis: eight seeds as well), and
uploads of a drawing of the input's size.

Starts `capsnet viz` in its own process (as a user would), then sends requests
from this one over one keep-alive connection, as a browser does while a slider
is dragged. Prints p50/p95/max per endpoint; --json records the table with the
command, commit, torch version and machine.

    python benchmarks/viz_latency.py [--checkpoint RUN_DIR] [--requests 500] [--json FILE]
"""
from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time


def start_viewer(args: argparse.Namespace) -> tuple[subprocess.Popen, str, int]:
    cmd = [sys.executable, "-m", "capsnet", "viz", "--port", "0", "--quiet"]
    if args.checkpoint:
        cmd += ["--checkpoint", args.checkpoint]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    if args.test_size is not None:
        cmd += ["--test-size", str(args.test_size)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    for line in proc.stdout:
        if line.startswith("open http://"):
            host, port = line.split()[1][len("http://"):].rstrip("/").split(":")
            return proc, host, int(port)
    raise SystemExit(f"the viewer did not start:\n{proc.stderr.read()}")


def timed(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[float, dict]:
    t0 = time.perf_counter()
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    ms = (time.perf_counter() - t0) * 1000
    if r.status != 200:
        raise SystemExit(f"{path} answered {r.status}: {data[:200]!r}")
    return ms, json.loads(data)


def info_of(conn: http.client.HTTPConnection) -> dict:
    conn.request("GET", "/api/info")
    r = conn.getresponse()
    return json.loads(r.read())


def walks(conn: http.client.HTTPConnection, info: dict, n: int) -> list[dict]:
    """A segmentation or synthesis model's rows: test picks as the page sends them, then with the routing of the
    first layer that routes more than once (and, for synthesis, the most seeds), then uploads of a drawn stroke."""
    from PIL import Image
    import numpy as np

    kind, (C, H, W) = info["kind"], info["input"]
    layers = [layer["name"] for layer in info["layers"] if layer["routing"] and layer["routing"]["rounds"] > 1]
    for k in range(3):  # warm-up
        timed(conn, "/api/forward", json.dumps({"index": k % info["test_size"]}).encode())
    rows = [summary("POST /api/forward (test input)", [
        timed(conn, "/api/forward", json.dumps({"index": k % info["test_size"]}).encode())[0] for k in range(n)])]
    if layers:
        ask = {"routing": layers[0], **({"seeds": list(range(info["max_seeds"]))} if kind == "synthesis" else {})}
        name = f"POST /api/forward (+ routing of {layers[0]}" + (f", {info['max_seeds']} seeds)" if kind == "synthesis"
                                                                   else ")")
        rows.append(summary(name, [timed(conn, "/api/forward", json.dumps(
            {"index": k % info["test_size"], **ask}).encode())[0] for k in range(n)]))
    drawing = np.zeros((H, W, 3) if C == 3 else (H, W), dtype=np.uint8)
    drawing[H // 4:3 * H // 4, W // 2] = 255  # one stroke, as the page scales a drawing to the input's size
    buf = io.BytesIO()
    Image.fromarray(drawing).save(buf, "PNG")
    rows.append(summary(f"POST /api/upload ({W}x{H} drawing)", [timed(conn, "/api/upload", buf.getvalue())[0]
                                                                for _ in range(n)]))
    return rows


def summary(name: str, ms: list[float]) -> dict:
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"endpoint": name, "requests": len(ms), "p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2),
            "max_ms": round(max(ms), 2), "mean_ms": round(statistics.fmean(ms), 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="run directory (default: the untrained paper CapsNet)")
    p.add_argument("--data-dir", default=None, help="data root for the checkpoint's test set")
    p.add_argument("--requests", type=int, default=500, help="slider moves to time (picks and uploads: a tenth)")
    p.add_argument("--test-size", type=int, default=None, help="test inputs the viewer loads (capsnet viz's flag)")
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()

    from PIL import Image
    import numpy as np

    proc, host, port = start_viewer(args)
    try:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        info = info_of(conn)
        if info.get("kind", "classification") != "classification":
            rows = walks(conn, info, max(10, args.requests // 10))
            conn.close()
            return report(args, rows)
        _, walk = timed(conn, "/api/forward", b'{"index": 0}')
        j = walk["predicted"]
        base = walk["poses"][j]
        rng = random.Random(0)
        for _ in range(20):  # warm-up
            timed(conn, "/api/reconstruct", json.dumps({"capsule": j, "pose": base}).encode())
        slider = []
        for k in range(args.requests):  # a drag: one dimension at a time, small steps within +-0.25
            pose = list(base)
            pose[k % 16] += rng.uniform(-0.25, 0.25)
            ms, _ = timed(conn, "/api/reconstruct", json.dumps({"capsule": j, "pose": pose}).encode())
            slider.append(ms)
        n = max(10, args.requests // 10)
        pick = [timed(conn, "/api/forward", json.dumps({"index": k}).encode())[0] for k in range(n)]
        digit = np.zeros((280, 280), dtype=np.uint8)
        digit[40:240, 120:160] = 255  # a drawn "1", as the page's canvas sends it
        buf = io.BytesIO()
        Image.fromarray(digit).save(buf, "PNG")
        upload = [timed(conn, "/api/upload", buf.getvalue())[0] for _ in range(n)]
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)

    rows = [summary("POST /api/reconstruct (slider move)", slider), summary("POST /api/forward (test image)", pick),
            summary("POST /api/upload (280x280 drawing)", upload)]
    report(args, rows)


def report(args: argparse.Namespace, rows: list[dict]) -> None:
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    env = {"commit": commit, "torch": torch.__version__, "python": platform.python_version(),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores", "threads": torch.get_num_threads(),
           "checkpoint": args.checkpoint or "untrained paper CapsNet"}
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    header = f"{'endpoint':56s} {'n':>5s} {'p50 ms':>8s} {'p95 ms':>8s} {'max ms':>8s}"
    print(header)
    for r in rows:
        print(f"{r['endpoint']:56s} {r['requests']:5d} {r['p50_ms']:8.2f} {r['p95_ms']:8.2f} {r['max_ms']:8.2f}")
    if args.json:
        from capsnet.bench import write_record

        write_record(args.json, shlex.join(["python", "benchmarks/viz_latency.py", *sys.argv[1:]]), env, rows)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
