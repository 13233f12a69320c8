"""python -m jaxmarket.record: a market's prices, traffic and rewards over time as an
animated GIF or an MP4, from a dataset or a scenario."""

import numpy as np
import pytest
from PIL import Image

from jaxmarket.cli import run_cli
from jaxmarket.offline import make_dataset, save_dataset
from jaxmarket.cli.record import main, series_from_dataset


def two_market_dataset(tmp_path):
    # 2 markets x 1 agent, 6 steps each, rows interleaved as collect writes them
    T = 6
    stream = np.tile([0, 1], T)
    step = np.repeat(np.arange(T), 2)
    price = (1.0 + 0.1 * step + 0.5 * stream).astype(np.float32)[:, None]
    ds = make_dataset(np.zeros((2 * T, 0)), price, 0.5 * price[:, 0], stream=stream, step=step,
                      episode=np.zeros(2 * T, np.int32),
                      meta={"group": "seller", "agents_per_market": 1},
                      **{"info/traffic": 2.0 - price, "info/prices": price})
    return save_dataset(ds, tmp_path / "d")


def test_dataset_series_is_market_zero_in_time_order(tmp_path):
    series = series_from_dataset(two_market_dataset(tmp_path))
    assert list(series) == ["seller[0]"]
    np.testing.assert_allclose(series["seller[0]"]["price"], 1.0 + 0.1 * np.arange(6), rtol=1e-6)
    np.testing.assert_allclose(series["seller[0]"]["traffic"], 1.0 - 0.1 * np.arange(6),
                               rtol=1e-5)
    np.testing.assert_allclose(series["seller[0]"]["reward"], 0.5 + 0.05 * np.arange(6),
                               rtol=1e-6)


def test_record_writes_a_gif_frame_per_step_and_an_mp4(tmp_path, capsys):
    data = two_market_dataset(tmp_path)
    assert run_cli(main, ["--dataset", str(data), "--out", str(tmp_path / "m.gif"),
                          "--steps", "5"]) == 0
    gif = Image.open(tmp_path / "m.gif")
    assert gif.n_frames == 5
    first = np.asarray(gif.convert("RGB"))
    gif.seek(4)
    last = np.asarray(gif.convert("RGB"))
    assert (first != last).any()          # the lines grow frame by frame
    assert run_cli(main, ["--dataset", str(data), "--out", str(tmp_path / "m.mp4")]) == 0
    assert (tmp_path / "m.mp4").read_bytes()[4:8] == b"ftyp"   # an MP4 container
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "m.gif", "m.mp4"]
    assert run_cli(main, ["--dataset", str(data), "--out", str(tmp_path / "m.avi")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"config error: --out: got '{tmp_path / 'm.avi'}'; allowed: a file name "
                   "ending in .gif or .mp4")
    with pytest.raises(SystemExit):
        main(["--out", "x.gif"])          # one source is required (argparse)
