"""What the run configuration and the server know about each DR-Encoder codec: one :class:`CodecSpec`
per name in :data:`CODEC_SPECS`; callers ask it, never compare a name.

Why two halves. ``common`` imports no ``autoencoder`` (tests/system/test_layers.py), yet
:meth:`common.config.RunConfig.check` and its ``public_prior`` need these facts; so they are plain data
here, and each codec's builders (the server's codec; a node's copy, unless it is broadcast) are its
:class:`autoencoder.codecs.CodecDescriptor`, which holds the spec below. A new codec is its class in
autoencoder/, one spec here and one descriptor in autoencoder/codecs.py: three files.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import FedloraError


@dataclass(frozen=True)
class CodecSpec:
    """One codec's facts.

    ``fitted_on_public``: the server fits it on its own public increments alone, a basis
    (server/public_prior.py ``fit_public_basis``): no statistics round, refitted every
    ``--prior-refresh`` rounds (``pca``).
    ``trains_autoencoder``: an autoencoder is trained for it, on synthetic gradients from the clients'
    statistics (``--ae-prior gaussian``) or on public increments (``--ae-prior public``) (``ae``).
    ``needs_public_subspace``: its latent is the coordinates in ``--public-subspace K`` public
    directions, so it needs K, and its release already lies in that subspace (no second projection).
    """

    name: str
    fitted_on_public: bool = False
    trains_autoencoder: bool = False
    needs_public_subspace: bool = False


#: name -> spec, in ``--codec``'s order
CODEC_SPECS: dict[str, CodecSpec] = {
    spec.name: spec
    for spec in (
        CodecSpec("ae", trains_autoencoder=True),
        CodecSpec("identity"),
        CodecSpec("constant-mean"),
        CodecSpec("random-projection"),
        CodecSpec("pca", fitted_on_public=True, needs_public_subspace=True),
    )
}


def find_codec(name: str) -> CodecSpec:
    """The spec registered as ``name``; :class:`FedloraError` (one line) if there is none."""
    spec = CODEC_SPECS.get(name)
    if spec is None:
        raise FedloraError(f"unknown codec '{name}'; choose {', '.join(CODEC_SPECS)}")
    return spec


__all__ = ["CODEC_SPECS", "CodecSpec", "find_codec"]
