"""tilefuse.distributed on a real local Ray cluster (started here, torn down at the end).

Two CPUs, two workers, a tiny network (tinynet at 16x16) so 2,000 inputs take about a second.
Outputs are compared bitwise with Session.run one by one in this process: the workers run the
same kernels on the same package with the same thread count (1).
"""
import os
import sys

import numpy as np
import pytest
import ray                       # the test extra pins it (ray[client,data]); missing -> these fail
from PIL import Image

import tilefuse
from tilefuse.distributed import (InputErrors, InputFailure, Pool, Predictor, WorkerLost, put_package,
                                  run_many)

N = 2000
SIZE = 16


@pytest.fixture(scope="module")
def cluster():
    # a cluster of our own (never one that happens to run on this machine), small object store,
    # no dashboard; NUMBA_CACHE_DIR (if set) reaches the workers through the environment
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20,
             logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny():
    pkg = tilefuse.compile(tilefuse.models.tinynet(seed=0, image_size=SIZE)).package
    sess = tilefuse.Session(pkg, threads=1)
    sess.warmup()  # numba's on-disk cache is filled here, so the workers only load it
    xs = [np.random.default_rng(i).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32) for i in range(N)]
    expected = [sess.run(x) for x in xs]
    return pkg, sess, xs, expected


def _same(results, expected):
    assert len(results) == len(expected)
    for i, (y, e) in enumerate(zip(results, expected)):
        assert not isinstance(y, InputFailure), f"input {i} failed: {y}"
        assert np.array_equal(y, e), f"input {i} differs"


class TestOnePoolOfTwoWorkers:
    """One pool for these tests (the CPUs go back when the class ends)."""

    @pytest.fixture(scope="class")
    @classmethod
    def counted_puts(cls):
        """Every ray.put made by this process while the class's pool lives: (type, nbytes)."""
        calls = []
        real = ray.put
        mp = pytest.MonkeyPatch()

        def put(value, *a, **kw):
            calls.append((type(value).__name__, getattr(value, "nbytes", None)))
            return real(value, *a, **kw)

        mp.setattr(ray, "put", put)
        yield calls
        mp.undo()

    @pytest.fixture(scope="class")
    @classmethod
    def pool(cls, cluster, tiny, counted_puts):
        with Pool(tiny[0], workers=2, threads_per_worker=1, start_timeout=120) as p:
            yield p

    def test_2000_inputs_two_workers_equal_session_run_in_order(self, pool, tiny, counted_puts):
        pkg, _, xs, expected = tiny
        ys = pool.run_many(xs, batch=16)
        _same(ys, expected)
        st = pool.stats
        assert st.items == N and st.failures == 0 and st.restarts == 0
        assert len(st.workers) == 2 and all(w.items > 0 for w in st.workers)      # both did work
        assert sum(w.items for w in st.workers) == N
        assert len({w.pid for w in st.workers}) == 2 and all(w.pid != os.getpid() for w in st.workers)
        # the package went into the object store once, as its .tfpkg bytes
        blob = tilefuse.compiler.package.to_bytes(pkg)
        assert counted_puts == [("ndarray", len(blob))]
        assert st.package_puts == 1 and st.package_bytes == len(blob)


    def test_killing_a_worker_mid_run_loses_and_duplicates_nothing(self, pool, tiny, counted_puts):
        _, _, xs, expected = tiny
        seen, out = [], {}
        victim = None
        for i, y in pool.imap(xs, batch=16):
            seen.append(i)
            out[i] = y
            if i == 400:
                victim = pool.actors[0]
                ray.kill(victim)
        assert seen == list(range(N))                       # each index once, in order
        _same([out[i] for i in range(N)], expected)
        st = pool.stats
        assert st.restarts == 1 and st.resubmitted_items > 0
        died = [w for w in st.workers if w.died]
        assert len(died) == 1 and "died" in died[0].died.lower()
        assert victim not in pool.actors and len(pool.actors) == 2
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(victim.info.remote(), timeout=60)
        assert len(counted_puts) == 1                       # the replacement used the same reference
        # and the pool keeps working with its replacement
        _same(pool.run_many(xs[:100], batch=7), expected[:100])


    def test_poisoned_inputs_reported_by_index_others_complete(self, pool, tiny):
        _, _, xs, expected = tiny
        bad = list(xs)
        bad[777] = np.zeros((1, 3, SIZE // 2, SIZE // 2), np.float32)          # wrong shape
        bad[1234] = xs[1234].astype(np.complex64)                               # wrong dtype
        bad[1500] = _Unbuildable()                                             # cannot even be unpickled there
        bad[1999] = "not an array"
        with pytest.raises(InputErrors) as ei:
            pool.run_many(bad, batch=16)
        e = ei.value
        assert [f.index for f in e.failures] == [777, 1234, 1500, 1999]
        assert "(1, 3, 8, 8)" in e.failures[0].error and f"(1, 3, {SIZE}, {SIZE})" in e.failures[0].error
        assert "complex64" in e.failures[1].error
        assert "could not run on the worker" in e.failures[2].error and "invalid literal" in e.failures[2].error
        assert "input 777" in str(e) and "4 of 2000 inputs failed" in str(e)
        assert pool.stats.restarts == 0                 # nothing here is a worker's death
        ok = [i for i in range(N) if i not in (777, 1234, 1500, 1999)]
        _same([e.results[i] for i in ok], [expected[i] for i in ok])
        # errors="return": the failures stay in their places
        ys = pool.run_many(bad[770:780], batch=4, errors="return")
        assert isinstance(ys[7], InputFailure) and ys[7].index == 7
        _same(ys[:7] + ys[8:], expected[770:777] + expected[778:780])


    def test_a_long_iterator_is_read_only_as_fast_as_results_return(self, pool, tiny):
        _, _, xs, expected = tiny
        consumed = 0

        def endless():                                      # 100k inputs, made on demand
            nonlocal consumed
            for i in range(100_000):
                consumed += 1
                yield xs[i % 50]

        batch, window = 8, 4
        lead = 0
        it = pool.imap(endless(), batch=batch, window=window)
        for n, (i, y) in enumerate(it):
            assert i == n and np.array_equal(y, expected[i % 50])
            lead = max(lead, consumed - n)
            if n == 500:
                break
        it.close()
        assert lead <= window * batch and pool.stats.max_buffered <= window * batch
        assert consumed <= 501 + window * batch
        _same(pool.run_many(xs[:20], batch=3), expected[:20])   # stopping early left the pool usable

    def test_a_producer_reusing_one_array_gets_every_input_right(self, pool, tiny):
        """A decoder that writes every frame into the same buffer: each input must be taken when
        it is read, not when its batch is sent."""
        _, _, xs, expected = tiny
        buf = np.empty_like(xs[0])

        def frames():
            for x in xs[:64]:
                buf[...] = x
                yield buf
        _same(pool.run_many(frames(), batch=8), expected[:64])


def test_an_input_that_kills_its_worker_ends_the_run_after_the_retry_limit(cluster, tiny):
    pkg, _, xs, _ = tiny
    items = list(xs[:64])
    items[37] = _KillsWorker()       # unpickled on the worker: the process exits, every time
    with Pool(pkg, workers=2, max_retries=1, start_timeout=120) as p:
        with pytest.raises(WorkerLost) as ei:
            p.run_many(items, batch=8)
        assert "input 37" in str(ei.value) and "max_retries=1" in str(ei.value)
        assert p.stats.restarts >= 2 and p.stats.package_puts == 1


class _Unbuildable:
    def __reduce__(self):
        return (int, ("x",))          # int("x") raises ValueError when the worker unpickles it


class _KillsWorker:
    def __reduce__(self):
        return (os._exit, (3,))


def test_run_many_function_and_pool_teardown(cluster, tiny):
    pkg, _, xs, expected = tiny
    ys, st = run_many(pkg, xs[:40], workers=2, batch=5, return_stats=True)
    _same(ys, expected[:40])
    assert st.items == 40 and st.package_puts == 1
    p = Pool(tilefuse.compiler.package.to_bytes(pkg), workers=1)      # .tfpkg bytes work too
    actor = p.actors[0]
    p.close()                                           # ray.kill: the actor goes, its CPU comes back
    assert _eventually(lambda: _is_dead(actor)) and _eventually(lambda: ray.available_resources().get("CPU") == 2)


def _eventually(cond, seconds=60.0):
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return False


def _is_dead(actor) -> bool:
    try:
        ray.get(actor.info.remote(), timeout=30)
        return False
    except ray.exceptions.RayActorError:
        return True


def test_pool_refuses_more_cpus_than_the_cluster_has(cluster, tiny):
    with pytest.raises(tilefuse.distributed.DistributedError, match="3 CPUs asked"):
        Pool(tiny[0], workers=3)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # Ray Data's own (use_polars, concurrency=)
def test_predictor_in_ray_data_map_batches(cluster):
    # batch 4 package: rows are packed four at a time, the last chunk zero-padded
    pkg = tilefuse.compile(tilefuse.models.tinynet(seed=1, image_size=SIZE, batch=4)).package
    sess = tilefuse.Session(pkg, threads=1)
    rows = np.random.default_rng(7).standard_normal((150, 3, SIZE, SIZE)).astype(np.float32)
    pad = np.zeros((3, 3, SIZE, SIZE), np.float32)
    expected = [sess.run(np.concatenate([rows[i:i + 1], pad]))[0] for i in range(len(rows))]
    ref = put_package(pkg)
    ds = ray.data.from_items([{"id": i, "image": rows[i]} for i in range(len(rows))], override_num_blocks=6)
    ds = ds.map_batches(Predictor, fn_constructor_kwargs={"package": ref}, concurrency=2, batch_size=10,
                        num_cpus=1)
    got = ds.take_all()
    assert sorted(r["id"] for r in got) == list(range(len(rows)))
    for r in got:
        assert set(r) == {"id", "output"}
        np.testing.assert_allclose(r["output"], expected[r["id"]], rtol=1e-5, atol=1e-6)


def test_predictor_top_k_and_bad_rows(tiny):
    pkg, sess, xs, expected = tiny
    pred = Predictor(pkg, top_k=3)
    out = pred({"image": np.concatenate(xs[:5]), "name": np.array(list("abcde"))})
    assert list(out["name"]) == list("abcde") and out["classes"].shape == (5, 3)
    for k in range(5):
        assert out["classes"][k][0] == int(np.argmax(expected[k]))
    with pytest.raises(tilefuse.distributed.DistributedError, match="row 1"):
        pred({"image": [xs[0][0], np.zeros((3, 8, 8), np.float32)]})


def test_importing_tilefuse_and_the_batch_cli_does_not_import_ray():
    import subprocess
    code = ("import sys, tilefuse, tilefuse.distributed, tilefuse.distributed.cli, tilefuse.cli; "
            "tilefuse.cli.build_parser(); assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- tilefuse batch

MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(3)
    px = lambda *shape: rng.integers(0, 256, shape, dtype=np.uint8)  # noqa: E731
    Image.fromarray(px(20, 30, 3)).save(d / "a_wide.png")
    Image.fromarray(px(41, 25, 3)).save(d / "b_tall.png")
    Image.fromarray(px(10, 12, 3)).save(d / "c_small.png")                 # smaller than the model's 16
    Image.fromarray(px(25, 25)).save(d / "gray.png")                       # mode L
    Image.fromarray(px(18, 18, 4)).save(d / "alpha.png")                   # RGBA
    Image.fromarray(px(16, 16, 3)).save(d / "UPPER.PNG")
    (d / "sub").mkdir()
    Image.fromarray(px(30, 40, 3)).save(d / "sub" / "photo.jpg", quality=90)
    (d / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(px(64)))  # a PNG signature, then junk
    (d / "empty.jpeg").write_bytes(b"")
    (d / "notes.txt").write_text("not an image, not listed")
    return d


def _expected_top(path, sess, k=3, size=SIZE):
    """The preprocessing written out again, independently: RGB by hand, shorter side to `size`
    (bilinear), centre crop, (x / 255 - mean) / std in float64, CHW; then Session.run and softmax."""
    img = Image.open(path)
    img.load()
    a = np.asarray(img)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)          # gray -> RGB
    a = a[:, :, :3]                                        # RGBA -> RGB (alpha dropped, as Pillow does)
    img = Image.fromarray(np.ascontiguousarray(a))
    w, h = img.size
    s = size / min(w, h)
    nw, nh = max(size, round(w * s)), max(size, round(h * s))
    img = img.resize((nw, nh), Image.BILINEAR)
    left, top = (nw - size) // 2, (nh - size) // 2
    x = np.asarray(img.crop((left, top, left + size, top + size)), np.float64) / 255
    x = ((x - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)
    y = sess.run(x)[0].astype(np.float64)
    p = np.exp(y - y.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")[:k]
    return [int(c) for c in order], [float(p[c]) for c in order]


def _read_csv(path):
    import csv
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.fixture(scope="module")
def tiny_file(tiny, tmp_path_factory):
    return str(tiny[0].save(tmp_path_factory.mktemp("pkg") / "tiny.tfpkg"))


def test_batch_cli_on_ray_writes_the_expected_csv(cluster, tiny, tiny_file, image_dir, tmp_path, capsys):
    from tilefuse.cli import main
    out = tmp_path / "pred.csv"
    rc = main(["batch", tiny_file, str(image_dir), "-o", str(out), "--workers", "2", "--top-k", "3",
               "--chunk", "2"])
    assert rc == 1                                         # some files could not be used
    text = capsys.readouterr()
    assert "9 files on 2 Ray workers" in text.out and "7 classified, 2 could not be used" in text.out
    assert "corrupt.png" in text.err and "empty.jpeg" in text.err
    rows = _read_csv(out)
    assert rows[0] == ["file", "class_1", "score_1", "class_2", "score_2", "class_3", "score_3", "error"]
    names = [r[0] for r in rows[1:]]
    assert names == ["UPPER.PNG", "a_wide.png", "alpha.png", "b_tall.png", "c_small.png", "corrupt.png",
                     "empty.jpeg", "gray.png", "sub/photo.jpg"]
    sess = tiny[1]
    for r in rows[1:]:
        if r[0] in ("corrupt.png", "empty.jpeg"):
            assert r[1:7] == [""] * 6
            assert ("not a readable PNG/JPEG image" if r[0] == "corrupt.png" else "empty file") in r[7]
            continue
        classes, scores = _expected_top(image_dir / r[0], sess)
        assert [int(c) for c in r[1:7:2]] == classes, r[0]
        np.testing.assert_allclose([float(s) for s in r[2:7:2]], scores, rtol=1e-4)
        assert r[7] == ""
    # the same CSV without Ray, in this process
    out0 = tmp_path / "pred0.csv"
    assert main(["batch", tiny_file, str(image_dir), "-o", str(out0), "--workers", "0", "--top-k", "3"]) == 1
    assert out0.read_text() == out.read_text()


def test_batch_cli_zoo_model_labels_and_errors(tiny, image_dir, tmp_path, capsys):
    from tilefuse.cli import main
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"class-{i}" for i in range(10)))
    out = tmp_path / "p.csv"
    assert main(["batch", "tinynet", str(image_dir), "-o", str(out), "--image-size", str(SIZE),
                 "--top-k", "2", "--labels", str(labels), "--resize", "stretch"]) == 1
    rows = _read_csv(out)
    assert rows[1][0] == "UPPER.PNG" and rows[1][1].startswith("class-") and len(rows[1]) == 6
    capsys.readouterr()
    pkg = tmp_path / "t.tfpkg"
    tiny[0].save(pkg)
    assert main(["batch", str(pkg), str(image_dir), "-o", str(out), "--image-size", "32"]) == 2
    assert "--image-size 32, but the package takes 16x16" in capsys.readouterr().err
    assert main(["batch", str(pkg), str(tmp_path / "nowhere"), "-o", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["batch", str(pkg), str(image_dir), "-o", str(out), "--mean", "0.5,0.5"]) == 2
    assert "3 mean and 3 std" in capsys.readouterr().err


def test_batch_cli_says_ray_is_needed_only_for_workers(tiny_file, image_dir, tmp_path):
    import subprocess
    out = tmp_path / "p.csv"
    code = ("import sys; sys.modules['ray'] = None; from tilefuse.cli import main; "
            f"sys.exit(main(['batch', {tiny_file!r}, {str(image_dir)!r}, '-o', {str(out)!r}, '--workers', "
            "sys.argv[1]]))")
    r = subprocess.run([sys.executable, "-c", code, "1"], capture_output=True, text=True)
    assert r.returncode == 2 and "--workers 1 runs on Ray" in r.stderr and "--workers 0" in r.stderr
    assert "pip install 'tilefuse[distributed]'" in r.stderr and not out.exists()
    r = subprocess.run([sys.executable, "-c", code, "0"], capture_output=True, text=True)
    assert r.returncode == 1 and len(_read_csv(out)) == 10, r.stderr
