"""The SecAgg+ protocol as pure stage functions: no messages, no network (Bonawitz et al. 2017, CCS,
"Practical Secure Aggregation for Privacy-Preserving Machine Learning", §4, with Bell et al. 2020's
sparse neighbour graph, common/secagg/graph.py), in its active-server form (Bonawitz §6): round keys
signed by long-term identities from the federation's roster, and a consistency check of the survivor
set before any share is revealed (common/secagg/identity.py states what remains assumed).

Stages, for the round's nodes U and each node u with neighbours N(u) (|N(u)| = k):

0. :func:`setup` (client): two fresh X25519 key pairs, (c_u, c_u^PK) to encrypt shares and
   (s_u, s_u^PK) to agree pairwise mask seeds, and a self-mask seed b_u of 32 bytes from
   ``os.urandom``; both public keys signed with u's identity key, bound to u and the round's
   parameters. :func:`route_keys` (server) hands each node its neighbours' public keys.
1. :func:`share_keys` (client): every neighbour's signature checked against the roster (refused
   otherwise), then t-of-|N(u)| Shamir shares of b_u and of the scalar s_u, the pair
   for neighbour v sealed under ECDH(c_u, c_v^PK) and bound to (round, u, v) (common/secagg/keys.py).
   :func:`route_shares` (server) forwards them; the senders are U_2.
2. :func:`masked_input` (client): for x_u in [0, 2^b)^d,
   y_u = x_u + PRF(b_u) + Σ_{v ∈ N(u) ∩ U_2, v > u} PRF(s_uv) − Σ_{v ∈ N(u) ∩ U_2, v < u} PRF(s_uv)  mod 2^b,
   with s_uv = HKDF(ECDH(s_u, s_v^PK)) and PRF = HKDF + ChaCha20 (common/secagg/prf.py, Bonawitz eq. 1-2).
   The senders of a masked input are the survivors U_3.
3. :func:`check_survivors` (client): the survivor set U_3 the server names, at least the node's
   fewest (``least``) and a majority of the round, signed by the node (once per round).
4. :func:`unmask` (client): only for the set it signed, carrying valid signatures of a majority of the
   round's nodes: shares of b_v for surviving neighbours and of s_v for the others that shared with
   it (dropped: derived by the node, never taken from the server), never both for one node.
   :func:`unmask_sum` (server): Σ_{u ∈ U_3} x_u mod 2^b, and nothing else.

Each stage runs once per round, in order: a second share, mask, check or unmask request is refused.

Costs per client, with k neighbours and d coordinates: 2 key pairs; 2k key agreements (k per key
pair: the share key ECDH(c_u, c_v^PK) seals and opens both directions, the mask seed s_uv); 2k
Shamir shares created (of b_u and of s_u, t-of-k, O(k·t) GF(2^128) products per 16-byte chunk),
sealed two per neighbour into k ciphertexts, and k opened; k+1 PRF expansions of d coordinates
(8·d keystream bytes each); messages of O(k) keys and shares plus one vector of d·b bits.
Server, with D nodes dropped after sharing: |U_3| + D Shamir reconstructions (t shares each), at
most k·D key agreements and |U_3| + k·D PRF expansions of length d, then O(|U_3|·d) additions.

The sum is exact mod 2^b: choose b so that the true sum never wraps (b >= log2(n · max coordinate)).
Secret randomness comes only from the OS CSPRNG (``os.urandom``, OpenSSL, pycryptodome's
``get_random_bytes``). A client must answer :func:`unmask` at most once per round (the caller drops
its :class:`Client` state afterwards): the both-shares refusal only holds per answer.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from common.secagg import graph, identity, keys, prf, shamir
from common.secagg.errors import SecAggError
from common.secagg.identity import Identity

_SEED = prf.SEED_BYTES


@dataclass(frozen=True)
class Params:
    """One round's public parameters, the same at every node.

    ``node_ids``: the round's distinct node ids (< 2^64); ``k``: neighbours per node; ``threshold``:
    t, the shares needed to reconstruct a secret; ``bits``: b, the modulus 2^b of the masked sum;
    ``length``: d, coordinates per input; ``public_seed``: fixes the neighbour graph (>= 16 bytes);
    ``run_id``: the Flower run the round belongs to (each node checks it is its own run's).
    """

    round_number: int
    node_ids: tuple[int, ...]
    k: int
    threshold: int
    bits: int
    length: int
    public_seed: bytes
    run_id: int = 0

    def validate(self) -> Params:
        """``self``, or a one-line :class:`SecAggError` (a FedloraError) naming the broken rule.

        The threshold bound enforced is k/2 < t <= k, precisely 2t > the largest neighbourhood
        (k, or k+1 when k and n are odd): two disjoint sets of t share holders cannot both exist
        among a node's neighbours, so one honest neighbour would see a request for b_u and one for
        s_u (and refuse, :func:`unmask`). Bonawitz et al. take t > n/2 for the same reason; Flower's
        SecAggPlusWorkflow only requires t < its share count (k+1, itself included) and t >= 2.
        """
        n, k, t = len(self.node_ids), self.k, self.threshold
        if not 1 <= self.bits <= prf.MAX_BITS:
            raise SecAggError(f"bits per coordinate must be in [1, {prf.MAX_BITS}], got {self.bits}")
        if self.length < 1:
            raise SecAggError(f"inputs need at least one coordinate, got length {self.length}")
        if len(set(self.node_ids)) != n or (n and not 0 <= min(self.node_ids) <= max(self.node_ids) < 2**64):
            raise SecAggError("node ids must be distinct integers in [0, 2^64)")
        if not 0 <= self.run_id < 2**64:
            raise SecAggError(f"the run id must be an integer in [0, 2^64), got {self.run_id}")
        if len(self.public_seed) < 16:
            raise SecAggError(f"the public graph seed needs at least 16 bytes, got {len(self.public_seed)}")
        if k < 2:
            raise SecAggError(f"each node needs at least 2 neighbours, got k={k}")
        if n < k + 1:
            raise SecAggError(f"{n} nodes cannot each have k={k} neighbours: need at least k+1={k + 1} nodes")
        if t > k:
            raise SecAggError(f"threshold t={t} exceeds the k={k} shares each node hands out")
        widest = graph.max_degree(n, k)
        if 2 * t <= widest:
            raise SecAggError(
                f"threshold t={t} must exceed half of the {widest} shares a node hands out (t > {widest}/2), "
                "so that no server request can gather both a node's self-mask and its mask key"
            )
        return self

    @cached_property
    def neighbours(self) -> dict[int, frozenset[int]]:
        """The round's SecAgg+ graph (common/secagg/graph.py), from public data only."""
        return graph.neighbours(self.node_ids, self.k, self.public_seed)

    @cached_property
    def digest(self) -> bytes:
        """SHA-256 of these parameters: what every signature of the round is bound to."""
        numbers = (self.k, self.threshold, self.bits, self.length)
        return identity.round_digest(self.run_id, self.round_number, self.node_ids, numbers, self.public_seed)


@dataclass(frozen=True)
class PublicKeys:
    """What node ``node_id`` advertises in stage 0: two 32-byte X25519 public keys (c_u^PK, s_u^PK),
    its identity's public key (OpenSSH line) and its signature of :func:`identity.keys_statement`."""

    node_id: int
    cipher: bytes
    mask: bytes
    identity: bytes = b""
    signature: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class Held:
    """A neighbour's shares that this client keeps: of its self-mask seed b_v and of its mask scalar s_v."""

    self_seed: bytes = field(repr=False)
    mask_key: bytes = field(repr=False)


#: a client's stages in order: the one it completed last (``Client.stage``)
STAGES = ("keys", "shared", "masked", "checked")


@dataclass(frozen=True)
class Client:
    """One client's state after a stage. The secrets never leave it except as Shamir shares.
    ``least``: the fewest survivors it unmasks for (its own plan's min-replies; at least t);
    ``stage``: the last stage it completed (:data:`STAGES`); ``signed``: the survivor set it signed;
    ``transcript``: the round's transcript it checked in :func:`share_keys` (node -> its
    :func:`identity.entry_digest`), to which its survivor-set signature is bound."""

    params: Params
    node_id: int
    cipher_key: X25519PrivateKey = field(repr=False)
    mask_key: X25519PrivateKey = field(repr=False)
    self_seed: bytes = field(repr=False)
    peers: Mapping[int, PublicKeys] = field(default_factory=dict)
    share_keys: Mapping[int, bytes] = field(default_factory=dict, repr=False)
    held: Mapping[int, Held] = field(default_factory=dict, repr=False)
    least: int = 0
    stage: str = "keys"
    signed: frozenset[int] = frozenset()
    transcript: Mapping[int, bytes] = field(default_factory=dict, repr=False)

    @cached_property
    def transcript_digest(self) -> bytes:
        """:func:`identity.transcript_digest` of this client's round transcript."""
        return identity.transcript_digest(self.params.digest, dict(self.transcript))

    def after(self, stage: str, request: str) -> None:
        """Refuse ``request`` unless ``stage`` is the stage this client completed last."""
        if self.stage != stage:
            raise SecAggError(
                f"node {self.node_id} refuses the {request} request: it is past the {stage} stage "
                f"(at {self.stage}); each stage runs once per round"
            )


@dataclass(frozen=True)
class UnmaskRequest:
    """The server's stage-4 request: who sent a masked input (``survivors``, U_3) and the survivors'
    signatures of that set, signer -> (the round keys it advertised, its identity's public line
    among them; its signature of the set)."""

    survivors: frozenset[int]
    signatures: Mapping[int, tuple[PublicKeys, bytes]] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class UnmaskReply:
    """One surviving client's answer: owner id -> share, of b_owner (survivors) or of s_owner (dropped)."""

    node_id: int
    self_seed_shares: Mapping[int, bytes] = field(repr=False)
    mask_key_shares: Mapping[int, bytes] = field(repr=False)


def setup(params: Params, node_id: int, me: Identity, least: int = 0) -> tuple[Client, PublicKeys]:
    """Stage 0 (client): fresh keys and self-mask seed, the keys signed by identity ``me``; returns
    the state and the keys to advertise. ``least``: the fewest survivors this client will unmask
    for (its own plan's; t when smaller)."""
    params.validate()
    if node_id not in params.neighbours:
        raise SecAggError(f"node {node_id} is not in round {params.round_number}")
    cipher_key, cipher_public = keys.new_key_pair()
    mask_key, mask_public = keys.new_key_pair()
    least = max(least, params.threshold)
    client = Client(params, node_id, cipher_key, mask_key, os.urandom(_SEED), least=least)
    signature = me.sign(identity.keys_statement(params.digest, node_id, cipher_public, mask_public))
    return client, PublicKeys(node_id, cipher_public, mask_public, me.public, signature)


def route_keys(params: Params, advertised: Mapping[int, PublicKeys]) -> dict[int, dict[int, PublicKeys]]:
    """Stage 0 (server): each advertising node -> its advertising neighbours' keys."""
    for node, public in advertised.items():
        if node not in params.neighbours or public.node_id != node:
            raise SecAggError(
                f"keys advertised for node {node} by node {public.node_id} in round {params.round_number}"
            )
    return {
        node: {v: advertised[v] for v in sorted(params.neighbours[node]) if v in advertised}
        for node in advertised
    }


def _pair_where(client: Client, sender: int, receiver: int) -> tuple[int, int, int]:
    return client.params.round_number, sender, receiver


def _check_signed(client: Client, peers: Mapping[int, PublicKeys], roster: frozenset[bytes]) -> None:
    """Refuse unless every peer's keys carry a valid signature of a distinct roster identity, bound
    to that peer and this round's parameters (a substituted key or an unknown node is refused)."""
    me, digest = client.node_id, client.params.digest
    for v, p in sorted(peers.items()):
        if not identity.verify(
            p.identity, p.signature, identity.keys_statement(digest, v, p.cipher, p.mask), roster
        ):
            raise SecAggError(
                f"node {me} refuses to share: node {v}'s keys are not signed by a roster identity "
                "for this round (substituted keys, or a node the federation does not know)"
            )
    owners = [p.identity for p in peers.values()]
    if len(set(owners)) != len(owners):
        raise SecAggError(f"node {me} refuses to share: two neighbours advertise the same identity")


def transcript(advertised: Mapping[int, PublicKeys]) -> dict[int, bytes]:
    """Stage 1 (server): the round's transcript, node -> :func:`identity.entry_digest` of the signed
    round keys it advertised (U_1); the same for every node."""
    return {v: identity.entry_digest(v, p.identity, p.cipher, p.mask) for v, p in advertised.items()}


def _check_transcript(client: Client, own: PublicKeys, peers: Mapping[int, PublicKeys], entries) -> None:
    """Refuse a neighbour under this node's own identity (one identity under two node ids), and a
    transcript that lists nodes outside the round, lists this node's or a neighbour's round keys
    other than this node knows them, or lists a neighbour whose keys it was not sent."""
    params, me = client.params, client.node_id
    if any(p.identity == own.identity for p in peers.values()):
        raise SecAggError(f"node {me} refuses to share: a neighbour advertises this node's own identity")
    if not set(entries) <= set(params.node_ids):
        raise SecAggError(f"node {me} refuses to share: the round's transcript names nodes outside the round")
    listed = params.neighbours[me] & set(entries)
    if listed != set(peers):
        raise SecAggError(
            f"node {me} refuses to share: the transcript lists neighbours {sorted(listed)}, it was sent "
            f"the keys of {sorted(peers)}"
        )
    for v, p in [(me, own), *peers.items()]:
        if entries.get(v) != identity.entry_digest(v, p.identity, p.cipher, p.mask):
            raise SecAggError(
                f"node {me} refuses to share: the round's transcript lists other keys for node {v} "
                "than this node holds"
            )


def share_keys(
    client: Client,
    peers: Mapping[int, PublicKeys],
    roster: frozenset[bytes],
    entries: Mapping[int, bytes],
    me: Identity,
) -> tuple[Client, dict[int, bytes]]:
    """Stage 1 (client): seal one share of b_u and one of s_u for each neighbour that advertised keys.

    Refuses when a neighbour's keys are not signed by a distinct identity of ``roster`` (the
    federation's public identity keys), when the round's transcript ``entries`` (:func:`transcript`)
    does not list exactly this node's own keys (``me``: its identity) and the neighbours' keys it was
    sent, when fewer than t neighbours advertised (the secrets could not be recovered), when a peer
    is no neighbour or reuses a key, or when it already shared. Returns the new state (the
    transcript kept: its survivor-set signature is bound to it) and receiver -> sealed token.
    """
    params, node = client.params, client.node_id
    client.after("keys", "share")
    if not set(peers) <= params.neighbours[node] or any(p.node_id != v for v, p in peers.items()):
        raise SecAggError(f"node {node} was sent keys of nodes that are not its neighbours: {sorted(peers)}")
    _check_signed(client, peers, roster)
    own = PublicKeys(
        node, keys.public_bytes(client.cipher_key), keys.public_bytes(client.mask_key), me.public
    )
    _check_transcript(client, own, peers, entries)
    if len(peers) < params.threshold:
        raise SecAggError(
            f"node {node}: only {len(peers)} neighbours advertised keys, threshold is {params.threshold}"
        )
    published = [key for p in peers.values() for key in (p.cipher, p.mask)]
    if len(set(published)) != len(published):
        raise SecAggError(f"node {node}: neighbours advertised repeated public keys")
    order = sorted(peers)
    seed_shares = shamir.split(client.self_seed, params.threshold, len(order))
    key_shares = shamir.split(keys.private_to_scalar(client.mask_key), params.threshold, len(order))
    pair_keys = {v: keys.agree(client.cipher_key, peers[v].cipher) for v in order}
    outbox = {}
    for v, seed_share, key_share in zip(order, seed_shares, key_shares, strict=True):
        payload = len(seed_share).to_bytes(2, "little") + seed_share + key_share
        outbox[v] = keys.seal_share(pair_keys[v], _pair_where(client, node, v), payload)
    shared = replace(
        client, peers=dict(peers), share_keys=pair_keys, stage="shared", transcript=dict(entries)
    )
    return shared, outbox


def route_shares(params: Params, outboxes: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
    """Stage 1 (server): sender -> receiver -> token becomes receiver -> sender -> token. The
    senders are U_2; keep ``{u: set(outboxes[u])}`` for :func:`unmask_sum`."""
    inboxes: dict[int, dict[int, bytes]] = {}
    for sender, outbox in outboxes.items():
        if not set(outbox) <= params.neighbours.get(sender, frozenset()):
            raise SecAggError(f"node {sender} sealed shares for nodes that are not its neighbours")
        for receiver, token in outbox.items():
            inboxes.setdefault(receiver, {})[sender] = token
    return inboxes


def _pair_pad(params: Params, seed: bytes, u: int, v: int) -> np.ndarray:
    """PRF(s_uv), shape (d,): the pad nodes u and v share this round (:func:`prf.pad`; the same
    for (u, v) and (v, u))."""
    info = prf.context(params.round_number, "pair", min(u, v), max(u, v))
    return prf.pad(seed, params.length, params.bits, info)


def _add_pair_pad(y: np.ndarray, client: Client, peer: int) -> None:
    """y ± PRF(s_uv) in place, for u = client, v = ``peer``: + when u < v, − otherwise (so the pair
    cancels); pads, reduced mod 2^b by the caller (:func:`prf.pad`)."""
    me = client.node_id
    words = _pair_pad(client.params, keys.agree(client.mask_key, client.peers[peer].mask), me, peer)
    if me < peer:
        y += words
    else:
        y -= words


def check_input(params: Params, x: np.ndarray) -> np.ndarray:
    """``x`` as words of :func:`prf.word_dtype` (uint32 when b ≤ 32, else uint64), shape (d,), or a
    one-line error: no coordinate outside [0, 2^b) is clipped."""
    x = np.asarray(x)
    if x.shape != (params.length,) or not np.issubdtype(x.dtype, np.integer):
        raise SecAggError(
            f"an input is an integer vector of shape ({params.length},), got {x.dtype} {x.shape}"
        )
    if x.size and (int(x.min()) < 0 or int(x.max()) >= 1 << params.bits):
        raise SecAggError(
            f"input coordinates must lie in [0, 2^{params.bits}), got [{int(x.min())}, {int(x.max())}]"
        )
    return x.astype(prf.word_dtype(params.bits))


def masked_input(client: Client, inbox: Mapping[int, bytes], x: np.ndarray) -> tuple[Client, np.ndarray]:
    """Stage 2 (client): open the neighbours' shares, keep them, and mask ``x`` (Bonawitz eq. 2).

    ``inbox``: sender -> token from :func:`route_shares`; ``x``: integers in [0, 2^b), shape (d,).
    Returns the new state and y_u, shape (d,), in [0, 2^b) (words of :func:`prf.word_dtype`, whose
    wrap-around is a multiple of 2^b). The pairwise masks cover the
    neighbours whose shares arrived (N(u) ∩ U_2): those are the ones that masked with u.
    """
    params, me = client.params, client.node_id
    client.after("shared", "mask")
    x = check_input(params, x)
    if not set(inbox) <= set(client.peers):
        raise SecAggError(
            f"node {me} received shares from nodes it did not share with: {sorted(set(inbox) - set(client.peers))}"
        )
    if len(inbox) < params.threshold:
        raise SecAggError(
            f"node {me}: only {len(inbox)} neighbours shared keys, threshold is {params.threshold}"
        )
    held = {}
    for v, token in inbox.items():
        payload = keys.open_share(client.share_keys[v], _pair_where(client, v, me), token)
        size = int.from_bytes(payload[:2], "little")
        held[v] = Held(payload[2 : 2 + size], payload[2 + size :])
    y = x + prf.pad(
        client.self_seed, params.length, params.bits, prf.context(params.round_number, "self", me)
    )
    for v in sorted(held):
        _add_pair_pad(y, client, v)
    client = replace(client, held=held, stage="masked")
    y &= y.dtype.type((1 << params.bits) - 1)
    return client, y


def check_survivors(client: Client, survivors: frozenset[int], me: Identity) -> tuple[Client, bytes]:
    """Stage 3 (client), the consistency check: sign the survivor set U_3 the server names, once.

    Refuses (one line) when this node is not in it, when it names nodes outside the round, or when it
    is smaller than the node's ``least`` or than a majority of the round (no unmasking could follow).
    Returns the new state (``signed``) and the signature of :func:`identity.survivors_statement`."""
    params, node = client.params, client.node_id
    client.after("masked", "consistency-check")
    need = max(client.least, identity.majority(len(params.node_ids)))
    if node not in survivors:
        raise SecAggError(f"node {node} refuses to sign: it is not listed among the survivors")
    if not survivors <= set(params.node_ids):
        raise SecAggError(f"node {node} refuses to sign: the survivors name nodes outside the round")
    if len(survivors) < need:
        raise SecAggError(
            f"node {node} refuses to sign: {len(survivors)} survivors < {need} (its min-replies "
            f"{client.least}, a majority of the round's {len(params.node_ids)} nodes)"
        )
    statement = identity.survivors_statement(
        client.transcript_digest, node, identity.survivors_digest(survivors)
    )
    return replace(client, stage="checked", signed=survivors), me.sign(statement)


def unmask_request(
    survivors: Collection[int], signatures: Mapping[int, tuple[PublicKeys, bytes]] | None = None
) -> UnmaskRequest:
    """Stage 4 (server): U_3 = the nodes whose masked input arrived, with their signatures of it
    (signer -> (its advertised round keys, signature))."""
    return UnmaskRequest(frozenset(survivors), dict(signatures or {}))


def count_signers(client: Client, request: UnmaskRequest, roster: frozenset[bytes], need: int) -> int:
    """How many survivors validly signed ``request.survivors`` for this round's transcript, each
    counted only from the identity the transcript names for it (the one that signed its round keys),
    up to ``need`` (the check stops once a majority is found). One identity presented for two
    signers is refused outright."""
    me, entries, owners = client.node_id, client.transcript, set()
    statement_of = identity.survivors_statement
    transcript, survivors = client.transcript_digest, identity.survivors_digest(request.survivors)
    for v, (signed, signature) in sorted(request.signatures.items()):
        if len(owners) >= need:
            break
        if signed.identity in owners:
            raise SecAggError(f"node {me} refuses to unmask: one identity signs for two nodes")
        if (
            v in request.survivors
            and signed.node_id == v
            and entries.get(v) == identity.entry_digest(v, signed.identity, signed.cipher, signed.mask)
            and identity.verify(signed.identity, signature, statement_of(transcript, v, survivors), roster)
        ):
            owners.add(signed.identity)
    return len(owners)


def unmask(client: Client, request: UnmaskRequest, roster: frozenset[bytes]) -> UnmaskReply:
    """Stage 4 (client): shares of b_v for surviving neighbours v, of s_v for the neighbours that
    shared with it and did not survive (derived here from the signed set, never the server's list).

    Refuses (one line) unless it is the set this node signed in :func:`check_survivors`, carrying
    valid signatures of a majority of the round's nodes (distinct ``roster`` identities); when fewer
    than t of its neighbourhood (itself included) survived; and when asked a second time. The
    server could otherwise learn a single input or strip a survivor's masks.
    """
    params, me = client.params, client.node_id
    client.after("checked", "unmask")
    if request.survivors != client.signed:
        raise SecAggError(f"node {me} refuses to unmask: the survivor set is not the one it signed")
    need = identity.majority(len(params.node_ids))
    signers = count_signers(client, request, roster, need)
    if signers < need:
        raise SecAggError(
            f"node {me} refuses to unmask: {signers} valid signatures of the survivor set, a majority "
            f"of the round's {len(params.node_ids)} nodes is {need}"
        )
    alive = len(request.survivors & (params.neighbours[me] | {me}))
    if alive < params.threshold:
        raise SecAggError(
            f"node {me} refuses to unmask: {alive} of its neighbourhood survived, threshold is {params.threshold}"
        )
    return UnmaskReply(
        me,
        {v: h.self_seed for v, h in client.held.items() if v in request.survivors},
        {v: h.mask_key for v, h in client.held.items() if v not in request.survivors},
    )


def _recover(owner: int, what: str, shares: list[bytes], params: Params, size: int) -> bytes:
    if len(shares) < params.threshold:
        raise SecAggError(
            f"only {len(shares)} shares of node {owner}'s {what} arrived, {params.threshold} needed to remove its mask"
        )
    return shamir.combine(shares, params.threshold, size)


def unmask_sum(
    params: Params,
    advertised: Mapping[int, PublicKeys],
    shared: Mapping[int, Collection[int]],
    masked: Mapping[int, np.ndarray],
    replies: Collection[UnmaskReply],
) -> np.ndarray:
    """Stage 3 (server): Σ_{u ∈ U_3} x_u mod 2^b, shape (d,), uint64; no individual input is formed.

    ``advertised``: stage-0 keys; ``shared``: U_2, sender -> the receivers of its shares; ``masked``:
    U_3, survivor -> y_u; ``replies``: the survivors' :class:`UnmaskReply`. Removes each survivor's
    self-mask (b_u from t shares) and, for each dropped u, its pairwise masks with the surviving
    neighbours (s_u from t shares, then ECDH with their s_v^PK, Bonawitz §4 round 4).
    """
    survivors = set(masked)
    if not survivors <= set(shared):
        raise SecAggError(
            f"masked inputs from nodes that did not share keys: {sorted(survivors - set(shared))}"
        )
    if len(survivors) < params.threshold:
        raise SecAggError(f"only {len(survivors)} masked inputs arrived, threshold is {params.threshold}")
    strangers = {r.node_id for r in replies} - survivors
    if strangers:
        raise SecAggError(f"unmask replies from nodes that sent no masked input: {sorted(strangers)}")
    dtype = prf.word_dtype(params.bits)  # sums wrap at 2^32 or 2^64, multiples of 2^b
    total = np.zeros(params.length, dtype=dtype)
    for u in sorted(survivors):
        total += check_input(params, masked[u])
    for u in sorted(survivors):
        seed = _recover(
            u,
            "self-mask seed",
            [r.self_seed_shares[u] for r in replies if u in r.self_seed_shares],
            params,
            _SEED,
        )
        total -= prf.pad(seed, params.length, params.bits, prf.context(params.round_number, "self", u))
    for u in sorted(set(shared) - survivors):
        scalar = _recover(
            u,
            "mask key",
            [r.mask_key_shares[u] for r in replies if u in r.mask_key_shares],
            params,
            keys.SCALAR_BYTES,
        )
        mask_key = keys.scalar_to_private(scalar)
        if keys.public_bytes(mask_key) != advertised[u].mask:
            raise SecAggError(f"node {u}'s reconstructed mask key does not match the key it advertised")
        for v in sorted(survivors & set(shared[u])):
            pad = _pair_pad(params, keys.agree(mask_key, advertised[v].mask), u, v)
            if v < u:  # y_v carried +PRF(s_uv)
                total -= pad
            else:
                total += pad
    total &= dtype.type((1 << params.bits) - 1)
    return total.astype(np.uint64)
