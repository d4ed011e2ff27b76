"""DR-Encoder wired into the federation: configuration, statistics on the wire, the client's latent
release, the server's decode + aggregate, and one federation end to end with its failure paths."""

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

from autoencoder.checkpoint import load_checkpoint
from autoencoder.codecs import CODECS, make_codec
from autoencoder.layout import Layout
from autoencoder.normalise import NORMALISATIONS
from autoencoder.synthetic import GRANULARITIES, pack_stats, unpack_stats
from autoencoder.train import LATENT_MODES
from client.drencoder.gradstats import privatise
from common import config
from common.errors import FedloraError
from common.presets import preset
from common.privacy.accounting.ledger import Ledger
from common.privacy.planning.plan import NoisePlan
from common.wire import InvalidReply, TrainInstruction, parse_stats_reply, stats_reply
from server.drencoder import AE_CONFIGS, AE_FILE, ServerCodec, ae_latent_size, fit_public_ae
from server.releases import RunHandles
from tests.harness import TINY, federate, message_identity, records

pytestmark = pytest.mark.integration

DR = dict(mechanism="dr-encoder", noise_multiplier=1.0, clip=0.5, ae_steps=2)


# -- configuration ------------------------------------------------------------------------------------------


def test_config_lists_match_the_implementations():
    assert config.CODECS == CODECS
    assert config.AE_NORMALISATIONS == NORMALISATIONS
    assert config.AE_LATENTS == LATENT_MODES
    assert tuple(AE_CONFIGS) == config.AE_SIZES
    assert set(config.STATS_GRANULARITIES) <= set(GRANULARITIES)
    assert config.MECHANISMS["dr-encoder"] == ("none", "dr-encoder")


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(noise_multiplier=0.0), "needs --noise-multiplier or --target-epsilon"),
        (dict(decode_order="decode-first", threat_model="distributed"), "decode-first needs"),
        (dict(local_optimizer="prism", sample_epsilon=4.0), "cannot be combined"),
        (dict(codec="svd"), "unknown codec"),
        (dict(codec="pca"), "--codec pca needs --public-subspace K"),
        (dict(stats_granularity="element"), "unknown stats-granularity"),
        (dict(stats_floor=0.0), "stats-floor"),
        (dict(stats_floor=0.01), "stats-floor"),
        (dict(stats_clip=0.0), "stats-clip must be > 0"),
        (dict(encode_at="server"), "--encode-at server needs --threat-model central"),
        (dict(encode_at="server", threat_model="distributed"), "--encode-at server needs"),
        (dict(encode_at="edge"), "unknown encode-at"),
    ],
)
def test_bad_dr_encoder_configs_fail_with_one_line(changes, message):
    with pytest.raises(FedloraError, match=message):
        preset("minilm-rt", **{**TINY, **DR, **changes}).check()


# -- statistics on the wire ---------------------------------------------------------------------------------


def _stats_msg(moments, granularity="matrix", noise=0.0) -> Message:
    message_identity()
    query = Message(RecordDict(), dst_node_id=1001, message_type="query.gradstats", group_id="stats")
    query.metadata.__dict__["_message_id"] = "q"
    content = stats_reply(moments, {"granularity": granularity, "noise-std": noise})
    return Message(content, reply_to=query)


def test_packed_statistics_round_trip_and_parse():
    shapes = {"a.A": (6, 3), "a.B": (5, 3)}
    stats = {n: (torch.randn(1, 3), torch.rand(1, 3)) for n in shapes}
    moments = pack_stats(stats, sorted(shapes))
    assert moments.shape == (2, 2, 3)
    parsed, size = parse_stats_reply(
        _stats_msg(moments, "column"), shapes, {"granularity": "column", "noise-std": 0.0}
    )
    for name, (mean, std) in unpack_stats(parsed, sorted(shapes)).items():
        torch.testing.assert_close(mean, stats[name][0])
        torch.testing.assert_close(std, stats[name][1])
    assert 0 < size < 1000


@pytest.mark.parametrize(
    "moments, expected, reason",
    [
        (
            torch.ones(2, 2, 3),
            {"granularity": "matrix", "noise-std": 0.0},
            "float32",
        ),  # column sent, matrix asked
        (-torch.ones(2, 2, 1), {"granularity": "matrix", "noise-std": 0.0}, "negative std"),
        (torch.full((2, 2, 1), float("nan")), {"granularity": "matrix", "noise-std": 0.0}, "non-finite"),
        (torch.ones(2, 2, 1), {"granularity": "matrix", "noise-std": 0.5}, "noise-std"),
    ],
)
def test_bad_statistics_are_rejected(moments, expected, reason):
    with pytest.raises(InvalidReply, match=reason):
        parse_stats_reply(_stats_msg(moments), {"a.A": (6, 3), "a.B": (5, 3)}, expected)


def test_privatised_statistics_are_clipped_and_noised_with_the_configured_std():
    moments = torch.rand(40, 2, 8) * 3
    clipped = privatise(moments, 1.5, 0.0)
    assert float(clipped.norm()) == pytest.approx(1.5, rel=1e-5)
    assert (privatise(moments, 1.5, 0.2)[:, 1] >= 0).all()
    # The means get clipped value + N(0, 0.2²): the empirical std over 40·8·50 draws is within 3 %.
    draws = torch.stack([privatise(moments, 1.5, 0.2)[:, 0] - clipped[:, 0] for _ in range(50)])
    assert float(draws.std()) == pytest.approx(0.2, rel=0.03)


# -- server decode + aggregate ------------------------------------------------------------------------------


def _codec(name, encode_at="client"):
    layout = Layout.from_shapes({"m.A": (12, 2), "m.B": (10, 2)}, multiple=4)
    mean = {n: torch.zeros(s) for n, s in layout.shapes.items()}
    codec = make_codec(name, layout=layout, mean=mean, latent_size=11, seed=1)
    return ServerCodec(codec, name, 1, ({"w": torch.ones(2)}, {}), encode_at)


def test_a_server_that_encodes_releases_what_clients_that_encode_would(monkeypatch):
    """``--encode-at server`` (central noise): the server encodes each raw increment and clips the
    coded update to C as the client-side release does; same noise draw, same released mean; and
    no encoder goes out."""
    from autoencoder.coded import encode_update
    from common.privacy.mechanisms.release import clip

    on_client, on_server = _codec("random-projection"), _codec("random-projection", "server")
    plan = NoisePlan(1.0, 0.1, 0.5, "central", 0.0, 1e-5, False)
    raw = [{"m.A": torch.randn(12, 2), "m.B": torch.randn(10, 2), "head": torch.randn(3)} for _ in range(3)]
    coded = [clip(encode_update(on_client.codec, r), 0.5)[0] for r in raw]  # the client-side release
    monkeypatch.setattr(
        "common.privacy.mechanisms.release.secrets.randbits", lambda _bits: 7
    )  # one noise draw
    expected = on_client.aggregate(coded, "aggregate-first", plan, 3.0)
    got = on_server.aggregate(raw, "aggregate-first", plan, 3.0)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name])
    assert on_client.records_for(5) and not on_server.records_for(5)
    shapes = {"m.A": (12, 2), "m.B": (10, 2), "head": (3,)}
    assert on_server.reply_shapes(shapes) == shapes
    assert on_client.reply_shapes(shapes) == {"latent": (11,), "head": (3,)}
    assert on_server.round_config["encode-at"] == "server"


def test_a_client_sends_its_raw_increment_only_when_its_run_config_says_server():
    from client.releases import release_dr_encoder

    cfg = preset("minilm-rt", **{**TINY, **DR, "threat_model": "central", "encode_at": "server"}).check()
    inc = {"m.A": torch.randn(12, 2)}
    ins = TrainInstruction(1, {}, 0.0, {**_codec("identity", "server").round_config})
    sent, meta = release_dr_encoder(inc, ins, cfg, torch.device("cpu"), None)
    assert sent is inc and meta == {"ae-version": "identity"}
    client_cfg = preset("minilm-rt", **{**TINY, **DR, "threat_model": "central"}).check()
    with pytest.raises(FedloraError, match="encode at the server, the run config says client"):
        release_dr_encoder(inc, ins, client_cfg, torch.device("cpu"), None)


@pytest.mark.parametrize("threat", ["local", "distributed"])
def test_linear_codecs_decode_the_same_mean_in_both_orders(threat):
    coder = _codec("random-projection")
    plan = NoisePlan(1.0, 1.0, 1.0, threat, 0.0, 1e-5, False)
    coded = [{"latent": torch.randn(11), "head": torch.randn(3)} for _ in range(3)]
    first = coder.aggregate(coded, "aggregate-first", plan, 3.0)
    second = coder.aggregate(coded, "decode-first", plan, 3.0)
    assert set(first) == {"m.A", "m.B", "head"}
    for name in first:
        torch.testing.assert_close(first[name], second[name])


def test_ae_latent_size_matches_the_model():
    from autoencoder.uformer import Uformer

    cfg = AE_CONFIGS["tiny"]()
    layout = Layout.from_shapes({"m.A": (40, 4), "m.B": (24, 4)}, multiple=cfg.downsample)
    H, W = layout.height, layout.width
    assert ae_latent_size(cfg, layout) == layout.num_images * math.prod(Uformer(cfg).latent_shape(H, W))


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_the_server_autoencoder_runs_on_the_device_the_run_names(tmp_path, monkeypatch, device):
    """--device goes through common.device.resolve_device like the rest of the server: a CUDA device
    on a machine without CUDA fails with one line before any work (it used to fall back to the CPU for
    ``cuda:N`` and crash inside torch for ``cuda``)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = preset("minilm-rt", **DR, device=device).check()
    layout = Layout.from_shapes({"m.A": (40, 4), "m.B": (24, 4)}, multiple=AE_CONFIGS["tiny"]().downsample)
    with pytest.raises(FedloraError, match=f"device '{device}' requested but CUDA is not available"):
        run = RunHandles(tmp_path, None, "r", lambda record: None, print, object())
        fit_public_ae(cfg, AE_CONFIGS["tiny"](), layout, {}, 1, run)
    assert not any(tmp_path.iterdir())


# -- one federation end to end ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dr_run(tmp_path_factory):
    """One dr-encoder round, privatised statistics; node 0's train message is also answered by a
    twin of node 0 (same data and local training, its own state directory, fresh noise) so the test
    can see the noise alone: node 0 itself answers each round once."""
    run_dir = tmp_path_factory.mktemp("dr") / "r"
    cfg = preset(
        "minilm-rt", **{**TINY, "rounds": 2}, **DR, stats_noise_multiplier=2.0, out_dir=str(run_dir)
    ).check()
    seen = {"encoder": []}

    def twice(client, msg, ctx):
        reply = client(msg, ctx)
        if msg.metadata.message_type == "train":
            seen["encoder"].append((msg.content["config"]["round"], "encoder" in msg.content))
        if msg.metadata.message_type == "train" and ctx.node_config["partition-id"] == 0:
            twin = {**ctx.node_config, "state-dir": str(run_dir.parent / "twin")}
            again = client(msg, Context(ctx.run_id, ctx.node_id, twin, RecordDict(), ctx.run_config))
            seen["pair"] = [r.content["increment"].to_torch_state_dict()["latent"] for r in (reply, again)]
            seen["std"] = msg.content["config"]["noise-std"]
        return reply

    federate(cfg, twice)
    return run_dir, seen


def test_dr_encoder_round_end_to_end_with_client_level_ledger(dr_run):
    run_dir, _ = dr_run
    recs = records(run_dir)
    stats = next(r for r in recs if r.get("phase") == "stats")
    assert stats["replied"] == 2 and stats["rejected"] == []
    assert stats["stats_bytes_per_client"] > 0 and stats["stats_fraction_of_increment"] <= 0.01
    assert any(r.get("phase") == "autoencoder" for r in recs)
    train = [r for r in recs if r.get("phase") == "train"]
    assert [(r["replied"], r["rejected"]) for r in train] == [(2, []), (2, [])]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dr_encoder"]["codec"] == "ae" and summary["dr_encoder"]["compression"] > 1
    assert summary["dr_encoder"]["ae_version"].startswith("ae-") and (run_dir / AE_FILE).exists()
    rows = Ledger.open(run_dir / "ledger.sqlite", "client-level").rows()
    assert [(r["round"], r["sigma"], r["status"]) for r in rows] == [
        (0, 2.0, "applied"),
        (1, 1.0, "applied"),
        (2, 1.0, "applied"),
    ]
    assert (
        summary["client_privacy"]["mu"] == pytest.approx(rows[-1]["mu"])
        and summary["client_privacy"]["eps_gdp"] > 0
    )


def test_encoder_goes_to_each_node_once_and_stays_in_the_shared_cache(dr_run):
    run_dir, seen = dr_run
    assert seen["encoder"] == [(1, True), (1, True), (2, False), (2, False)]
    version = json.loads((run_dir / "summary.json").read_text())["dr_encoder"]["ae_version"]
    cached = run_dir.parent / "nodes" / "shared" / "encoders" / f"{version}.safetensors"
    assert cached.is_file()  # one copy for the simulated nodes, none in each node's state dir
    assert not list((run_dir.parent / "nodes").glob("node-*/encoders"))
    # A restarted node (empty memory) encodes from its state dir alone; without it, a clear error.
    from client.drencoder import round_codec as client_codec

    client_codec._ENCODERS.clear()
    layout = load_checkpoint(run_dir / AE_FILE)[0].layout
    spec = {"codec": "ae", "ae-version": version, "layout": layout.to_json()}
    ins = TrainInstruction(3, {}, 0.0, spec)  # a round without the encoder broadcast
    codec = client_codec.round_codec(ins, torch.device("cpu"), cached.parent.parent)
    assert codec.version == version and codec.latent_size > 0
    client_codec._ENCODERS.clear()
    with pytest.raises(FedloraError, match="not cached on this node"):
        client_codec.round_codec(ins, torch.device("cpu"), run_dir)


def test_latent_noise_has_the_configured_std(dr_run):
    """Same training, two releases: their difference is N(0, 2·std²) per latent coordinate."""
    _, seen = dr_run
    z1, z2 = seen["pair"]
    assert seen["std"] == pytest.approx(1.0 * 0.5)  # local threat model: σ·C
    diff = (z1 - z2) / math.sqrt(2)
    assert diff.numel() > 1000
    assert float(diff.std()) == pytest.approx(seen["std"], rel=0.05)
    assert abs(float(diff.mean())) < 4 * seen["std"] / math.sqrt(diff.numel())


def _corrupt(kind):
    def change(content):
        record = content["increment"]
        latent = record["latent"].numpy()
        if kind == "shape":
            bad = np.zeros(latent.size + 1, np.float32)
        elif kind == "dtype":
            bad = latent.astype(np.float64)
        elif kind == "nan":
            bad = latent.copy()
            bad[3] = np.nan
        else:
            content["meta"]["ae-version"] = "ae-0000000000000000"
            return
        dense = {k: Array(v.numpy()) for k, v in record.items() if k != "latent"}
        content["increment"] = ArrayRecord({"latent": Array(np.ascontiguousarray(bad)), **dense})

    return change


def test_server_rejects_bad_latents_and_continues_with_the_others(tmp_path):
    kinds = ["shape", "dtype", "nan", "version"]
    cfg = preset("minilm-rt", **{**TINY, "num_clients": 5}, **DR, out_dir=str(tmp_path / "r")).check()

    def corrupting(client, msg, ctx):
        reply = client(msg, ctx)
        pid = ctx.node_config["partition-id"]
        if msg.metadata.message_type == "train" and pid > 0:
            _corrupt(kinds[pid - 1])(reply.content)
        return reply

    federate(cfg, corrupting)
    (train,) = [r for r in records(tmp_path / "r") if r.get("phase") == "train"]
    assert train["replied"] == 1 and len(train["rejected"]) == 4
    reasons = " | ".join(train["rejected"])
    for needle in ("latent: float32", "float64", "non-finite", "ae-version 'ae-0000000000000000'"):
        assert needle in reasons, reasons
    # statistics in the clear (the paper's setting): recorded in the ledger, the report and the summary
    ledger = Ledger.open(tmp_path / "r" / "ledger.sqlite", "client-level")
    (note,) = ledger.uncovered()
    assert note["round"] == 0 and "statistics sent in the clear" in note["what"]
    assert [r["round"] for r in ledger.rows()] == [1]  # no charge for it: its epsilon is not finite
    report = json.loads((tmp_path / "r" / "privacy.json").read_text())
    assert report["uncovered"] == [note]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert any("statistics sent in the clear" in line for line in summary["not_covered"])
    assert "zero-out adjacency" in summary["privacy"]  # local noise: participation is visible


def test_a_crashed_dr_encoder_run_resumes_with_its_statistics_and_autoencoder(tmp_path):
    """The server dies in round 2; the resumed run reuses the saved statistics and autoencoder (no new
    query, same version), and round 2 stays charged once, as interrupted. With the ``homogeneous`` latent
    (its gain travels in the encoder broadcast and the checkpoint)."""
    run = dict(**DR, ae_latent="homogeneous", out_dir=str(tmp_path / "r"))
    cfg = preset("minilm-rt", **{**TINY, "rounds": 2}, **run).check()

    def crash_in_round_2(client, msg, ctx):
        if msg.metadata.message_type == "train" and msg.content["config"]["round"] == 2:
            raise RuntimeError("server machine lost")
        return client(msg, ctx)

    with pytest.raises(RuntimeError, match="server machine lost"):
        federate(cfg, crash_in_round_2)
    ae_bytes = (tmp_path / "r" / AE_FILE).read_bytes()
    queries = []

    def count_queries(client, msg, ctx):
        queries.append(msg.metadata.message_type)
        return client(msg, ctx)

    federate(cfg.replace(resume=True), count_queries)
    assert "query.gradstats" not in queries and (tmp_path / "r" / AE_FILE).read_bytes() == ae_bytes
    recs = records(tmp_path / "r")
    assert [r["phase"] for r in recs if r["round"] == 0].count("stats") == 1
    rows = Ledger.open(tmp_path / "r" / "ledger.sqlite", "client-level").rows()
    assert [(r["round"], r["status"]) for r in rows] == [(1, "applied"), (2, "interrupted")]


@pytest.mark.slow
def test_the_statistics_round_trains_with_the_clients_optimizer(tmp_path, monkeypatch):
    """Algorithm 1's statistics describe the increments the train rounds make, so they come from the
    same local optimizer (--client-optimizer sgd was ignored there: AdamW always)."""
    import client.drencoder.gradstats as gradstats

    used, real = [], gradstats.train_steps

    def spy(trainee, schedule, **kwargs):
        used.append(schedule.optimizer)
        return real(trainee, schedule, **kwargs)

    monkeypatch.setattr(gradstats, "train_steps", spy)
    cfg = preset("minilm-rt", **TINY, **DR, client_optimizer="sgd", out_dir=str(tmp_path / "r")).check()
    federate(cfg)
    assert used and set(used) == {"sgd"}
