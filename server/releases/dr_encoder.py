"""``dr-encoder``: the Gaussian release of an autoencoder latent (DR-Encoder, AAAI 2025). Before
round 1 the statistics round and the autoencoder (server/drencoder.py); every round names the codec
and broadcasts the encoder to nodes that lack it; replies are coded updates, decoded here. With
``--encode-at server`` (central noise) nothing is broadcast: replies are raw increments, encoded here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flwr.serverapp import Grid

from common.models import AdapterState
from common.privacy.mechanisms.mechanism import RoundSum
from server.drencoder import ServerCodec, prepare_codec, refresh_public_codec
from server.releases.base import Release, RunHandles


class DrEncoderRelease(Release):
    name = "dr-encoder"
    coder: ServerCodec

    def prepare(self, grid: Grid, nodes: Sequence[int], state: AdapterState, run: RunHandles) -> dict:
        super().prepare(grid, nodes, state, run)
        self.run, self.fitted = run, None  # fitted: the round the pca basis was fitted for
        self.coder, info = prepare_codec(grid, self.cfg, nodes, state, run)
        return info

    def before_round(self, rnd: int, state: AdapterState) -> None:
        """A public-prior codec (``pca``, or ``ae`` on the public prior) is refitted from the current
        global adapter every ``prior-refresh`` rounds (a new version: every node gets the new basis or
        encoder with its next instruction)."""
        super().before_round(rnd, state)  # the mechanism's own state (a stateful one's stream)
        if self.cfg.public_prior:
            self.coder, self.fitted = refresh_public_codec(
                self.coder, self.fitted, self.cfg, rnd, state, self.run
            )

    @property
    def codec(self) -> dict[str, object]:
        return self.coder.round_config

    def records_for(self, node: int) -> dict:
        return self.coder.records_for(node)

    def expected(self, sampled: int) -> dict[str, object]:
        return {**super().expected(sampled), "ae-version": self.coder.version}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return self.coder.reply_shapes(shapes)

    def check(self, increment: AdapterState) -> None:
        """A raw increment (``--encode-at server``) is clipped after encoding, so its norm is not checked."""
        if self.coder.encode_at == "client":
            super().check(increment)

    def answered(self, node: int, usable: bool) -> None:
        self.coder.replied(node, usable)

    def round_sum(self, sampled: int) -> RoundSum:
        """The mechanism's sum of the coded releases, decoded in the run's decode order."""
        return self.coder.round_sum(super().round_sum(sampled), self.cfg.decode_order)


__all__ = ["DrEncoderRelease"]
