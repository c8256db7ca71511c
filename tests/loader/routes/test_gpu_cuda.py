"""The GPU path on a CUDA device: same samples, crops and flips as the CPU path, pixels within
tolerance, eager and compiled equal, exact resume, stats, stream safety.

Tolerance (also in docs/performance.md): the crop/resize/flip math equals the CPU path's within one
level given the same decoded pixels (tested below with nvJPEG's pixels); end to end, nvJPEG and
libjpeg-turbo differ in IDCT and chroma upsampling, so on these grainy synthetic photos the mean
absolute difference per image stays under ``MEAN_TOL`` levels (worst seen on an H200: 2.1) and
fewer than ``FRAC_TOL`` of values differ by more than ``BIG`` levels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.codec.nvjpeg import GpuJpegDecoder
from shardkit.loader import GpuOptions
from shardkit.loader.routes.device.pinned import PinnedSlot
from shardkit.loader.routes.gpu.host import GpuPipeline
from shardkit.transforms.gpu import GEOMETRY_COLUMNS
from tests.loader.gpu_helpers import (
    batches_on_cpu,
    emulate_device,
    make_packed_imagenet_like,
    pixels,
    raw_and_cpu_streams,
)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

MEAN_TOL, BIG, FRAC_TOL = 3.0, 16, 0.01


@pytest.fixture(scope="module")
def inet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_packed_imagenet_like(tmp_path_factory.mktemp("inet_cuda"))


@pytest.mark.parametrize("preset", [transforms.imagenet_train, transforms.imagenet_val])
def test_gpu_matches_cpu_path(inet: Path, preset: object) -> None:
    t = preset(224)  # type: ignore[operator]
    cpu = batches_on_cpu(inet, "cpu", t, num_workers=2)
    gpu = batches_on_cpu(inet, "cuda", t, num_workers=2)
    assert len(cpu) == len(gpu)
    worst = 0.0
    for (a, la, ka), (b, lb, kb) in zip(cpu, gpu, strict=True):
        assert ka == kb and torch.equal(la, lb)
        diff = (a.int() - b.int()).abs().float()
        for d in diff:
            worst = max(worst, d.mean().item())
            assert d.mean() <= MEAN_TOL and (d > BIG).float().mean() <= FRAC_TOL
    print(f"worst per-image mean abs diff GPU vs CPU: {worst:.3f}")


@pytest.mark.parametrize("compile", [True, False])
@pytest.mark.parametrize("preset", [transforms.imagenet_train, transforms.imagenet_val])
def test_device_pipeline_equals_reference_on_nvjpeg_pixels(inet: Path, preset: object, compile: bool) -> None:
    t = preset(224)  # type: ignore[operator]
    dev = torch.device("cuda")
    _, raw = raw_and_cpu_streams(inet, t)
    pipe, slot = GpuPipeline(t, dev, compile=compile), PinnedSlot(16, (224, 224), len(GEOMETRY_COLUMNS), pin=True)
    decoder = GpuJpegDecoder(dev)
    for batch in raw:
        want = emulate_device(batch, decoder.decode)
        slot.stage(batch)
        got = pixels(pipe(batch, slot)).cpu()
        assert (got.int() - want.int()).abs().max() <= 1


def test_flips_match(inet: Path) -> None:
    """A mirrored crop compares far better to its own CPU twin than to the unmirrored one."""
    t = transforms.imagenet_train(224)
    cpu = batches_on_cpu(inet, "cpu", t)[:2]
    gpu = batches_on_cpu(inet, "cuda", t)[:2]
    for (a, _, _), (b, _, _) in zip(cpu, gpu, strict=True):
        same = (a.int() - b.int()).abs().float().mean(dim=(1, 2, 3))
        mirrored = (a.int() - b.flip(-1).int()).abs().float().mean(dim=(1, 2, 3))
        assert bool((same <= mirrored + 1e-6).all())


def test_eager_and_compiled_agree(inet: Path) -> None:
    t = transforms.imagenet_train(224)
    a = batches_on_cpu(inet, "cuda", t, gpu=GpuOptions(compile=True), num_workers=3)
    b = batches_on_cpu(inet, "cuda", t, gpu=GpuOptions(compile=False), num_workers=3)  # slow augment: queues run full
    for (x, _, kx), (y, _, ky) in zip(a, b, strict=True):
        assert kx == ky and (x.int() - y.int()).abs().max() <= 1


@pytest.mark.parametrize("decoder", ["torchvision", "torchcodec"])
def test_several_decode_threads_give_the_same_batches(inet: Path, decoder: str) -> None:
    """decode_threads=3: three decoders on three streams finish out of order; the batches come
    back in order and equal to one thread's (nvJPEG is deterministic)."""
    from shardkit.codec.backend import prefer_decoder

    if decoder == "torchcodec":
        pytest.importorskip("torchcodec")
    prefer_decoder(decoder)
    try:
        t = transforms.imagenet_train(128)
        one = batches_on_cpu(inet, "cuda", t, num_workers=2)
        three = batches_on_cpu(inet, "cuda", t, num_workers=2, gpu=GpuOptions(decode_threads=3))
    finally:
        prefer_decoder(None)
    assert len(one) == len(three)
    for (x, lx, kx), (y, ly, ky) in zip(one, three, strict=True):
        assert kx == ky and torch.equal(lx, ly) and torch.equal(x, y)


def test_resume_and_finalize_and_stats(inet: Path) -> None:
    t = transforms.imagenet_train(224, normalize=True, dtype=torch.bfloat16, channels_last=True)
    full = ShardLoader(str(inet), batch_size=16, transform=t, device="cuda", keys=True, seed=3, num_workers=2)
    ref = [(x.float().cpu(), k) for x, _, k in full]
    stats = full.stats
    # the fixture's CMYK and PNG files are decoded by the workers; its grayscale one too where
    # the device's decoder does not take grayscale JPEGs
    from shardkit.codec.nvjpeg import gpu_decodes_gray

    worker_decoded = 2 if gpu_decodes_gray(torch.device("cuda")) else 3
    assert stats.gpu_images > 0 and stats.gpu_fallback == worker_decoded and stats.gpu_decode_s >= 0
    part = ShardLoader(str(inet), batch_size=16, transform=t, device="cuda", keys=True, seed=3, num_workers=1)
    it = iter(part)
    x, _, _ = next(it)
    assert x.dtype == torch.bfloat16 and x.is_contiguous(memory_format=torch.channels_last)
    next(it)
    state = part.state_dict()
    del it
    again = ShardLoader(str(inet), batch_size=16, transform=t, device="cuda", keys=True, seed=3, num_workers=3)
    again.load_state_dict(state)
    rest = [(x.float().cpu(), k) for x, _, k in again]
    assert [k for _, k in rest] == [k for _, k in ref[2:]]
    for (a, _), (b, _) in zip(rest, ref[2:], strict=True):
        assert torch.equal(a, b)


def test_batches_are_safe_on_a_user_stream(inet: Path) -> None:
    t = transforms.imagenet_train(224)
    ref = batches_on_cpu(inet, "cuda", t)
    stream = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(stream):
        loader = ShardLoader(str(inet), batch_size=16, transform=t, device="cuda", keys=True, seed=7)
        for x, _, _ in loader:
            got.append((x.float() * 1).to(torch.uint8).cpu())
    for (a, _, _), b in zip(ref, got, strict=True):
        assert torch.equal(a, b)


def test_grayscale_jpegs_decode_on_the_gpu_as_pil_converts_them() -> None:
    """The device's decoder takes grayscale JPEGs (so workers ship them encoded), in a batch with
    colour ones, as three equal channels within the end-to-end tolerance of PIL's convert("RGB")."""
    import io

    import numpy as np
    from PIL import Image

    from shardkit.codec.backend import GRAY_TOLERANCE, gpu_decoder
    from shardkit.codec.nvjpeg import gpu_decodes_gray

    device = torch.device("cuda")
    if gpu_decoder(device)[0] != "torchvision":
        pytest.skip(f"measured with torchvision's nvJPEG decoder; this process decodes with {gpu_decoder(device)[0]!r}")
    assert gpu_decodes_gray(device)
    sample = Path(__file__).resolve().parents[3] / "sample_data" / "imagefolder"
    colour = [p.read_bytes() for p in sorted(sample.rglob("*.jpg"))[:8]]
    grays, wants = [], []
    for data in colour:
        buf = io.BytesIO()
        with Image.open(io.BytesIO(data)) as im:
            im.convert("L").save(buf, "JPEG", quality=90)
        grays.append(buf.getvalue())
        with Image.open(io.BytesIO(buf.getvalue())) as im:
            wants.append(torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1))
    mixed = [d for pair in zip(colour, grays, strict=True) for d in pair]
    out = GpuJpegDecoder(device).decode([torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in mixed])
    worst = 0.0
    for got, want in zip(out[1::2], wants, strict=True):
        got = got.cpu()
        assert got.shape == want.shape and torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])
        worst = max(worst, (got.int() - want.int()).abs().float().mean().item())
    print(f"grayscale on the GPU against PIL: worst mean absolute difference {worst:.3f}")
    assert worst <= GRAY_TOLERANCE


def test_nvjpeg_decodes_cut_pieces_like_whole_images() -> None:
    """nvJPEG on the restart intervals around a box gives the box's pixels of nvJPEG on the whole
    (restart-indexed) image: random boxes on real photos, and boxes in a narrow last interval."""
    import io
    import random

    import numpy as np
    from PIL import Image

    from shardkit.codec import jpeg_restart
    from shardkit.codec.decode import peek_size
    from shardkit.codec.nvjpeg import nvjpeg_friendly

    if not jpeg_restart.available():
        pytest.skip("restart-indexed JPEG extension not built")
    from torchvision.io import decode_jpeg

    sample = Path(__file__).resolve().parents[3] / "sample_data" / "imagefolder"
    datas = [p.read_bytes() for p in sorted(sample.rglob("*.jpg"))[:60]]
    for raw in datas[:20]:  # grayscale photos: the GPU routes ship them too where the decoder takes them
        buf = io.BytesIO()
        with Image.open(io.BytesIO(raw)) as im:
            im.convert("L").save(buf, "JPEG", quality=90)
        datas.append(buf.getvalue())
    rng_np = np.random.default_rng(0)
    for width in (33, 35, 50, 52):  # last interval 1-4 px wide for 4:2:0
        buf = io.BytesIO()
        Image.fromarray(rng_np.integers(0, 256, (40, width, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        datas.append(buf.getvalue())
    rng, t = random.Random(0), transforms.imagenet_train(224)
    worst_mean, worst_max, checked = 0.0, 0, 0
    for raw in datas:
        data = jpeg_restart.transcode(raw, 1)
        if data is None or not nvjpeg_friendly(data, gray=True):
            continue
        h, w = peek_size(data)
        boxes = [t.sample_params(h, w, rng), transforms.CropFlip(h // 3, w - 2, h // 2, 2)]
        whole = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), device="cuda").cpu()
        for b in boxes:
            piece = jpeg_restart.cut(data, b.top, b.left, b.height, b.width)
            assert piece is not None
            part = decode_jpeg(torch.frombuffer(bytearray(piece.data), dtype=torch.uint8), device="cuda").cpu()
            assert tuple(part.shape[1:]) == (piece.height, piece.width)
            y, x = b.top - piece.top, b.left - piece.left
            got = part[:, y : y + b.height, x : x + b.width].int()
            want = whole[:, b.top : b.top + b.height, b.left : b.left + b.width].int()
            diff = (got - want).abs()
            worst_mean, worst_max = max(worst_mean, diff.float().mean().item()), max(worst_max, int(diff.max()))
            checked += 1
    print(f"nvJPEG piece vs whole: {checked} boxes, worst mean {worst_mean:.3f}, worst max {worst_max}")
    assert checked > 100
    assert worst_mean < 0.5 and worst_max <= BIG, (worst_mean, worst_max)


def test_cpu_path_to_cuda_pins_batches_and_matches_cpu(inet: Path) -> None:
    """A plain callable takes the CPU path; its batches reach CUDA through DataLoader's pin
    thread (Batch.pin_memory) and equal the CPU run's."""
    from shardkit.loader.routes.cpu.worker import CpuBatch
    from shardkit.loader.stats import StageStats

    batch = CpuBatch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([1, 2]), ["a", "b"], StageStats())
    pinned = batch.pin_memory()
    assert pinned.images.is_pinned() and pinned.labels.is_pinned()  # type: ignore[union-attr]

    def half(image: torch.Tensor) -> torch.Tensor:
        return image[:, ::2, ::2].contiguous()

    def run(device: str) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
        loader = ShardLoader(str(inet), batch_size=16, transform=half, device=device, num_workers=2, seed=3)
        out = []
        for x, y in loader:
            assert x[0].device.type == device and y.device.type == device
            out.append(([im.cpu() for im in x], y.cpu()))
        return out

    for (a, b), (c, d) in zip(run("cuda"), run("cpu"), strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a, c, strict=True)) and torch.equal(b, d)


def test_cpu_fallback_to_cuda_through_the_shared_batch_pool(inet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA without nvJPEG: an ImageTransform decodes on the CPU into the workers' shared batch pool,
    DataLoader's pin thread copies each slot into pinned memory, and the batches equal the CPU run."""
    from shardkit.loader.routes import choose as routing
    from shardkit.loader.routes.cpu import CpuRoute

    monkeypatch.setattr(routing, "gpu_decode_unavailable", lambda _device: "simulated: no nvJPEG")
    t = transforms.imagenet_train(224)
    # read_ahead=False: with read-ahead the workers go on into the next epoch, whose batches
    # rightly hold slots when this one ends; here every slot must be back after each epoch.
    cuda = ShardLoader(str(inet), batch_size=16, transform=t, device="cuda", num_workers=2, seed=7, keys=True,
                       read_ahead=False)
    pool = cuda.route.pool if isinstance(cuda.route, CpuRoute) else None
    assert pool is not None
    got = [(x.cpu(), y.cpu(), k) for x, y, k in cuda]
    assert all(x.device.type == "cuda" for x, _y, _k in cuda)
    assert pool._received and int(pool.busy.sum()) == 0  # served from the pool, every slot given back
    cuda.close()
    assert len(got) == len(cuda)
    cpu = batches_on_cpu(inet, "cpu", t, num_workers=2)
    assert [k for *_, k in got] == [k for *_, k in cpu]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, cpu, strict=True))


@pytest.mark.timeout(180)
def test_iterating_again_or_closing_never_leaves_an_iterator_hanging(inet: Path) -> None:
    """A second iteration stops the first one's prefetcher (two would pull from the same
    workers), and an iterator of a closed loader ends with a LoaderError instead of blocking."""
    loader = ShardLoader(str(inet), batch_size=8, transform=transforms.imagenet_train(64), device="cuda",
                         num_workers=2, seed=3)
    first = iter(loader)
    next(first)
    assert len([x for x, _ in loader]) == len(loader)  # the next epoch, whole
    with pytest.raises(LoaderError, match="ended after"):
        next(first)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(LoaderError, match="ended after"):
        next(it)
    assert len([x for x, _ in loader]) == len(loader)  # usable after close, as on the other routes
    loader.close()


def test_a_script_that_ends_mid_epoch_without_closing_exits_cleanly(inet: Path) -> None:
    """The prefetcher's threads stop at interpreter exit before native libraries are torn down
    under a decode still running in one of them (which can abort the process with "terminate
    called without an active exception")."""
    import subprocess
    import sys

    script = ("import torch\nfrom shardkit import ShardLoader, transforms\n"
              f"loader = ShardLoader({str(inet)!r}, batch_size=8, transform=transforms.imagenet_train(64), "
              "device='cuda', num_workers=2, feeders=0)\n"
              "it = iter(loader)\nfor _ in range(3): next(it)\nprint('ok')\n")
    for _ in range(5):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
        assert "terminate called" not in done.stderr


@pytest.mark.parametrize("feeders", [0, 1])
def test_a_loader_copied_mid_epoch_on_the_gpu_gives_the_next_epoch(inet: Path, feeders: int) -> None:
    """Pickled and deep-copied after its first batches (its staging slots hold CUDA events, its
    prefetcher threads and streams; feeders running with ``feeders=1``): each copy makes its own
    and gives the next epoch's samples; the original ends its epoch as if never copied."""
    import copy
    import pickle

    kw = {"batch_size": 8, "transform": transforms.imagenet_train(64), "num_workers": 2, "keys": True, "seed": 3,
          "device": "cuda", "feeders": feeders}
    with ShardLoader(str(inet), **kw) as plain:  # type: ignore[arg-type]
        plain.set_epoch(0)
        first = [k for _, _, k in plain]
        plain.set_epoch(1)
        second = [k for _, _, k in plain]
    with ShardLoader(str(inet), **kw) as loader:  # type: ignore[arg-type]
        loader.set_epoch(0)
        it = iter(loader)
        got = [next(it)[2], next(it)[2]]
        for twin in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
            with twin:
                assert [k for _, _, k in twin] == second
        got += [k for _, _, k in it]
    assert got == first


@pytest.mark.parametrize("feeders", [0, "auto"])
def test_a_look_before_the_process_group_then_reads_the_ranks_share(inet: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      feeders: object) -> None:
    """The GPU route (and its feeders) after ``next(iter(loader))`` at rank 0 of 1 and a world
    that then appears (Lightning's fit): the next epoch is this rank's share, from workers and
    feeders started anew."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    t = transforms.imagenet_train(64)
    with ShardLoader(str(inet), batch_size=16, transform=t, device="cuda", num_workers=2, keys=True, seed=2,
                     feeders=feeders) as loader:  # type: ignore[arg-type]
        next(iter(loader))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "1")
        got = [(list(keys), labels.cpu()) for _images, labels, keys in loader]
    with ShardLoader(str(inet), batch_size=16, transform=t, device="cuda", num_workers=2, keys=True, seed=2,
                     rank=1, world_size=2, feeders=0) as want:
        want.set_epoch(1)
        expected = [(list(keys), labels.cpu()) for _images, labels, keys in want]
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, expected, strict=True))
