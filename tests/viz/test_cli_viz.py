"""`capsnet viz` as a user starts it: a real process, a real port, clear errors."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest


def start_with_stdout(*args):
    """`capsnet viz ARGS` on a free port: the process, its URL and the lines it printed before the URL."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "capsnet", "viz", "--port", "0", "--quiet", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    before = []
    for line in proc.stdout:
        if line.startswith("open http://"):
            return proc, line.split()[1], "".join(before)
        before.append(line)
    proc.kill()
    raise AssertionError(f"the viewer did not start: {proc.stderr.read()}")


def start(*args):
    proc, url, _ = start_with_stdout(*args)
    return proc, url


def stop(proc):
    proc.terminate()
    proc.wait(timeout=60)  # 20 s ran out once in a suite run beside other heavy processes (2026-12-02)
    return proc.stderr.read()


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.e2e
def test_viz_serves_a_checkpoint(trained_run, data_root):
    """The run was trained without --val-size: its best.safetensors was chosen on the test split, so the viewer,
    which shows the test images' predictions, opens the final epoch's weights, as eval scores them (it opened best
    while the quick start's eval scored last: a review, 2026-11-30)."""
    proc, url, printed = start_with_stdout("--checkpoint", str(trained_run), "--data-dir", str(data_root))
    try:
        info = get(url + "api/info")
        assert info["trained"] is True and info["dataset"] == "mnist" and info["test_size"] == 10000
        assert info["checkpoint"] == str(trained_run / "last.safetensors")
        assert "best.safetensors was chosen on the test split" in printed and "shown from last.safetensors" in printed
        with urllib.request.urlopen(url, timeout=30) as r:
            assert b"capsnet viewer" in r.read()
    finally:
        assert "UNTRAINED" not in stop(proc)


def test_viz_untrained_says_so_and_a_viewer_on_every_network_warns():
    proc, url = start("--untrained", "--host", "0.0.0.0", "--allow-host", "Viewer.Example")
    try:
        info = get(url + "api/info")
        assert info["trained"] is False and info["checkpoint"] is None and info["dataset"] == "mnist-sample"
        port = url.rstrip("/").rsplit(":", 1)[1]
        with urllib.request.urlopen(urllib.request.Request(url + "api/info", headers={
                "Host": f"viewer.example:{port}"}), timeout=30) as r:  # the name it was told
            assert json.loads(r.read())["dataset"] == "mnist-sample"
        with pytest.raises(urllib.error.HTTPError) as refused:  # any other
            urllib.request.urlopen(urllib.request.Request(url + "api/info", headers={"Host": "evil.example"}))
        assert refused.value.code == 403
    finally:
        err = stop(proc)
    assert "UNTRAINED" in err
    # the server has no password: bound to every interface, the terminal says so (it printed a loopback URL alone)
    assert "warning: the viewer listens on 0.0.0.0, reachable from other machines, without a password" in err


def test_viz_untrained_with_a_checkpoint_is_refused(trained_run, capsys, monkeypatch):
    import capsnet.viz
    from cli_helpers import in_process

    def no_server(*args, **kwargs):  # in this process: a viewer not refused fails here, not serves for ever
        raise AssertionError("a server was started")

    monkeypatch.setattr(capsnet.viz, "make_server", no_server)
    r = in_process(capsys, "viz", "--untrained", "--checkpoint", str(trained_run))  # refused before a server starts
    assert r.returncode == 2 and "--untrained and --checkpoint contradict each other" in r.stderr


def test_viz_bad_flags(tmp_path, trained_run, data_root, capsys):
    from cli_helpers import in_process

    for flags, said in ((["--port", "70000"], "not a port number"),  # refused before a server starts: in process
                        (["--checkpoint", str(tmp_path / "missing")], "does not exist")):
        r = in_process(capsys, "viz", *flags)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr
    with socket.socket() as busy:  # in this process too: the server fails to bind before it serves
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = in_process(capsys, "viz", "--checkpoint", str(trained_run), "--data-dir", str(data_root), "--port",
                       str(busy.getsockname()[1]))
    assert r.returncode == 2 and "cannot listen" in r.stderr and "pick another --port" in r.stderr
    r = in_process(capsys, "viz", "--checkpoint", str(trained_run), "--data-dir", str(data_root), "--host",
                   "999.1.1.1", "--port", "0")
    assert r.returncode == 2 and "cannot listen on 999.1.1.1:0" in r.stderr  # not a port's fault: it said so
    assert "give --host an address of this machine" in r.stderr and "--port" not in r.stderr.split("(")[-1]



def test_the_default_port_taken_on_macos_names_airplay(trained_run, data_root, capsys, monkeypatch):
    """macOS 12 and later listen on 5000, the viewer's default, for AirPlay Receiver (a review of portability,
    2026-12-02): there the refusal names it."""
    import errno
    import sys

    import capsnet.viz
    from cli_helpers import in_process

    def taken(*args, **kwargs):
        raise OSError(errno.EADDRINUSE, "Address already in use")

    monkeypatch.setattr(capsnet.viz, "make_server", taken)
    flags = ["viz", "--checkpoint", str(trained_run), "--data-dir", str(data_root)]
    r = in_process(capsys, *flags)
    assert r.returncode == 2 and "pick another --port or stop what uses it" in r.stderr and "AirPlay" not in r.stderr
    monkeypatch.setattr(sys, "platform", "darwin")
    r = in_process(capsys, *flags)
    assert r.returncode == 2 and "AirPlay Receiver listens on 5000: --port 8000" in r.stderr
    r = in_process(capsys, *flags, "--port", "5001")
    assert r.returncode == 2 and "AirPlay" not in r.stderr


@pytest.mark.e2e
def test_viz_serves_a_segmentation_run(segmentation_run, data_root):
    proc, url = start("--checkpoint", str(segmentation_run), "--data-dir", str(data_root), "--test-size", "4")
    try:
        info = get(url + "api/info")
        assert info["kind"] == "segmentation" and info["model_name"] == "segcaps-r1" and info["test_size"] == 4
        assert info["dataset"] == "mnist-segmentation"
        assert info["checkpoint"] == str(segmentation_run / "last.safetensors")  # its best was chosen on test
        ask = urllib.request.Request(url + "api/forward", data=json.dumps({"index": 3}).encode(), method="POST")
        with urllib.request.urlopen(ask, timeout=60) as r:
            walk = json.loads(r.read())
        assert 0.0 <= walk["dice"] <= 1.0 and walk["probability"]["shape"] == [1, 64, 64]
    finally:
        assert "UNTRAINED" not in stop(proc)


def test_viz_refuses_a_segmentation_run_on_a_classification_set(segmentation_run, data_root, capsys):
    from capsnet.cli import main

    assert main(["viz", "--checkpoint", str(segmentation_run), "--dataset", "mnist", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "segcaps-r1 is a segmentation model but mnist is a classification data set" in err


@pytest.mark.e2e
def test_viz_serves_a_synthesis_run(gan_run, data_root):
    proc, url = start("--checkpoint", str(gan_run), "--data-dir", str(data_root), "--test-size", "4")
    try:
        info = get(url + "api/info")
        assert info["kind"] == "synthesis" and info["model_name"] == "capspix2pix" and info["test_size"] == 4
        assert info["dataset"] == "mnist-skeleton" and info["input"] == [1, 32, 32] and info["noise"] == "vector"
        body = json.dumps({"index": 2, "seeds": [4, 5]}).encode()
        with urllib.request.urlopen(urllib.request.Request(url + "api/forward", data=body, method="POST"),
                                    timeout=60) as r:
            walk = json.loads(r.read())
        assert walk["samples"]["shape"] == [2, 1, 32, 32] and walk["seeds"] == [4, 5] and len(walk["scores"]) == 2
    finally:
        assert "UNTRAINED" not in stop(proc)


def test_viz_refuses_a_gan_on_a_data_set_of_another_kind(gan_run, data_root, capsys):
    from capsnet.cli import main

    assert main(["viz", "--checkpoint", str(gan_run), "--dataset", "mnist", "--data-dir", str(data_root),
                 "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "capspix2pix is a synthesis model but mnist is a classification data set" in err
    assert "mnist-skeleton, mnist-sample-skeleton (offline), fashion-silhouette or pairs:DIR" in err


@pytest.mark.e2e
def test_viz_without_checkpoint_opens_the_shipped_model_offline_and_ctrl_c_while_requests_run_stops_cleanly():
    """`capsnet viz` alone opens the shipped model, on the shipped digits. Then, in the same viewer: Ctrl-C with
    requests in flight ended `capsnet viz` in SIGABRT ('terminate called without an active exception', a core
    dump): the interpreter's shutdown stopped handler threads inside torch's C++ code (a review, 2026-11-30). It
    prints 'stopped' and exits 0, as when idle."""
    import http.client
    import signal
    import threading
    import time

    from capsnet import pretrained

    # a checkout without the shipped model (tools/make_pretrained.py) opens an untrained one: the Ctrl-C alone is
    # checked there
    shipped = "capsnet-mnist-small" in pretrained.names()
    proc, url = start()
    if shipped:
        try:
            info = get(url + "api/info")
            assert info["trained"] is True and info["dataset"] == "mnist-sample" and info["test_size"] == 500
            # by its name, not the install's path, which a --host 0.0.0.0 viewer showed anyone (a review, 2026-11-30)
            assert info["checkpoint"] == f"pretrained:{pretrained.DEFAULT}"
        except BaseException:
            stop(proc)
            raise
    stop_clients = threading.Event()

    def client():
        while not stop_clients.is_set():
            try:
                req = urllib.request.Request(url + "api/forward", data=b'{"index": 1}',
                                             headers={"Content-Type": "application/json"})
                urllib.request.urlopen(req, timeout=10).read()
            except (OSError, http.client.HTTPException):  # the server stopped, a response cut short among them
                return
    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # requests running
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=30)
    finally:
        stop_clients.set()
    out, err = proc.stdout.read(), proc.stderr.read()
    assert code == 0 and "stopped" in out and "terminate called" not in err, (code, out, err)
    assert not shipped or "UNTRAINED" not in err


def test_the_viewer_process_limits_glibcs_pools():
    """Each handler thread ran the model from a glibc pool of its own, whose freed memory stayed: RSS 1.8x under 16
    clients (a review, 2026-11-30). capsnet viz limits the pools to two (a no-op off glibc)."""
    import platform

    from capsnet.memory import limit_arenas

    assert limit_arenas(2) is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
    with pytest.raises(ValueError, match="arenas must be an integer >= 1, got 0"):
        limit_arenas(0)
