"""The SecAgg+ stages end to end (common/secagg/protocol.py): the server's sum is exact mod 2^b
with and without dropouts, one client's masked vector looks uniform to the server, clients refuse
requests that would reveal a single input (an active server's included: substituted keys,
inconsistent survivor sets, repeated requests), misrouted shares fail authentication, and bad
parameters fail in one line."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import pytest

from common.errors import FedloraError
from common.secagg import identity, keys
from common.secagg import protocol as sa
from common.secagg.errors import SecAggError, ShareAuthError

#: node id -> its identity (every id the tests use), and the federation's roster of them
IDENTITIES = {u: identity.new_identity() for u in [*range(10), *range(1000, 1000 + 7 * 24, 7)]}
ROSTER = frozenset(i.public for i in IDENTITIES.values())


@dataclass
class Round:
    """A round run up to the masked inputs: the clients' states and what the server holds."""

    params: sa.Params
    clients: dict[int, sa.Client]
    advertised: dict[int, sa.PublicKeys]
    shared: dict[int, set[int]]
    inputs: dict[int, np.ndarray]
    masked: dict[int, np.ndarray]


def params(n=10, k=4, t=3, bits=16, d=64, round_number=1) -> sa.Params:
    return sa.Params(
        round_number, tuple(range(1000, 1000 + 7 * n, 7)), k, t, bits, d, os.urandom(32)
    ).validate()


def share_all(p: sa.Params, never_share=()) -> tuple[dict, dict, dict]:
    """Stages 0-1 for every node: (clients, advertised keys, outboxes of the nodes that shared);
    ``never_share``: nodes that drop after advertising their keys."""
    clients, advertised = {}, {}
    for u in p.node_ids:
        clients[u], advertised[u] = sa.setup(p, u, IDENTITIES[u])
    routed, entries = sa.route_keys(p, advertised), sa.transcript(advertised)
    outboxes = {}
    for u in p.node_ids:
        clients[u], outbox = sa.share_keys(clients[u], routed[u], ROSTER, entries, IDENTITIES[u])
        if u not in never_share:
            outboxes[u] = outbox
    return clients, advertised, outboxes


def run_to_masked(p: sa.Params, inputs=None, never_share=()) -> Round:
    """Stages 0-2 for every node; ``never_share``: nodes that drop after advertising their keys."""
    rng = np.random.default_rng()
    clients, advertised, outboxes = share_all(p, never_share)
    inboxes = sa.route_shares(p, outboxes)
    inputs = inputs or {u: rng.integers(0, 2 ** (p.bits - 5), p.length) for u in outboxes}
    masked = {}
    for u in outboxes:
        clients[u], masked[u] = sa.masked_input(clients[u], inboxes[u], inputs[u])
    return Round(p, clients, advertised, {u: set(o) for u, o in outboxes.items()}, inputs, masked)


def signed_request(r: Round, survivors, signers=None) -> sa.UnmaskRequest:
    """Stage 3, the consistency check: ``signers`` (default: every survivor) sign the survivor set;
    the unmask request carries their signatures."""
    survivors = frozenset(survivors)
    signatures = {}
    for u in sorted(survivors if signers is None else signers):
        r.clients[u], signatures[u] = sa.check_survivors(r.clients[u], survivors, IDENTITIES[u])
    return sa.unmask_request(survivors, {u: (r.advertised[u], s) for u, s in signatures.items()})


def finish(r: Round, dropped=(), silent=()) -> np.ndarray:
    """Stages 3-4: ``dropped`` never send their masked input; ``silent`` send it, then drop before unmasking."""
    survivors = {u: y for u, y in r.masked.items() if u not in dropped}
    request = signed_request(r, survivors)
    replies = [sa.unmask(r.clients[u], request, ROSTER) for u in survivors if u not in silent]
    return sa.unmask_sum(r.params, r.advertised, r.shared, survivors, replies)


def exact(r: Round, nodes) -> np.ndarray:
    return sum(r.inputs[u].astype(np.uint64) for u in nodes) % np.uint64(2**r.params.bits)


def test_the_sum_is_exact_without_dropouts():
    r = run_to_masked(params(n=12, k=6, t=4, bits=20, d=500))
    total = finish(r)
    assert total.dtype == np.uint64 and total.shape == (500,)
    assert np.array_equal(total, exact(r, r.params.node_ids))
    assert all(int(y.max()) < 2**20 for y in r.masked.values())


def test_the_sum_wraps_mod_2_to_the_b():
    p = params(n=6, k=2, t=2, bits=3, d=200)
    inputs = {u: np.full(200, 7) for u in p.node_ids}
    assert np.array_equal(finish(run_to_masked(p, inputs)), np.full(200, 6 * 7 % 8, dtype=np.uint64))


def test_twenty_percent_dropping_after_sharing_leave_the_survivors_sum():
    r = run_to_masked(params(n=20, k=10, t=6, d=300))  # any 4 lost leave each node 6 of 10 holders
    dropped = set(r.params.node_ids[::5])  # 4 of 20: their pairwise masks come back through s_u's shares
    assert np.array_equal(finish(r, dropped=dropped), exact(r, set(r.params.node_ids) - dropped))


def test_twenty_percent_dropping_after_the_masked_upload_still_count():
    r = run_to_masked(params(n=20, k=10, t=6, d=300))  # any 4 lost leave each node 6 of 10 holders
    silent = set(r.params.node_ids[2::5])  # their y arrived; their self-masks come back through b_u's shares
    assert np.array_equal(finish(r, silent=silent), exact(r, r.params.node_ids))


def test_dropouts_at_every_stage_together():
    p = params(n=15, k=10, t=6, d=100)  # 4 of 15 lost: every node keeps at least 6 of its 10 share holders
    ids = p.node_ids
    r = run_to_masked(p, never_share={ids[0]})
    total = finish(r, dropped={ids[4], ids[9]}, silent={ids[7]})
    assert np.array_equal(total, exact(r, set(ids) - {ids[0], ids[4], ids[9]}))


def _chi_square(values: np.ndarray, bins: int) -> float:
    counts = np.bincount(values.astype(np.int64), minlength=bins)
    expected = values.size / bins
    return float(((counts - expected) ** 2 / expected).sum())


#: chi-square, 15 degrees of freedom, upper 1e-9 quantile (scipy.stats.chi2.ppf(1 - 1e-9, 15)): a
#: uniform view fails one run in a billion (the suite must not flake); the controls below exceed it ~50x
CHI2_15 = 73.63


def test_the_server_sees_a_uniform_vector_for_an_all_zero_input():
    views = []
    for round_number in range(4):  # fresh keys and seeds each round, as in a deployment
        p = params(n=5, k=2, t=2, bits=4, d=1000, round_number=round_number)
        r = run_to_masked(p, {u: np.zeros(1000, dtype=np.int64) for u in p.node_ids})
        views.append(r.masked[p.node_ids[0]])
    view = np.concatenate(views)
    assert _chi_square(view, 16) < CHI2_15
    assert _chi_square(np.zeros(view.size), 16) > CHI2_15  # the test can fail: the bare input is not uniform
    skewed = np.where(np.arange(view.size) % 4 == 0, 0, view)  # a quarter of the coordinates left unmasked
    assert _chi_square(skewed, 16) > CHI2_15


def test_a_client_never_reveals_both_shares_of_a_node():
    """The dropped set is the node's own (its share holders outside the signed survivors), never the
    server's word: no reply carries both shares of one node."""
    r = run_to_masked(params())
    ids = r.params.node_ids
    request = signed_request(r, set(ids) - {ids[3]})
    for u in set(ids) - {ids[3]}:
        reply = sa.unmask(r.clients[u], request, ROSTER)
        assert not set(reply.self_seed_shares) & set(reply.mask_key_shares)
        assert set(reply.mask_key_shares) <= {ids[3]}


def test_a_client_refuses_to_sign_a_set_without_itself_or_too_small():
    r = run_to_masked(params(n=10, k=4, t=3))
    me, others = r.params.node_ids[0], r.params.node_ids[1:]
    with pytest.raises(SecAggError, match=f"node {me} refuses to sign: it is not listed among the survivors"):
        sa.check_survivors(r.clients[me], frozenset(others), IDENTITIES[me])
    with pytest.raises(SecAggError, match=rf"node {me} refuses to sign: 5 survivors < 6 \(its min-replies 3"):
        sa.check_survivors(r.clients[me], frozenset([me, *others[:4]]), IDENTITIES[me])
    least = sa.setup(r.params, me, IDENTITIES[me], least=9)[0]  # a node whose plan needs 9 survivors
    least = dataclasses.replace(least, stage="masked")
    with pytest.raises(SecAggError, match=r"8 survivors < 9 \(its min-replies 9"):
        sa.check_survivors(least, frozenset([me, *others[:7]]), IDENTITIES[me])


def test_a_client_refuses_when_too_few_of_its_neighbourhood_survived():
    r = run_to_masked(params(n=10, k=4, t=3))
    me = r.params.node_ids[0]
    mates = r.params.neighbours[me]
    survivors = {
        me,
        sorted(mates)[0],
        *(set(r.params.node_ids) - mates - {me}),
    }  # 2 of 5 in its neighbourhood
    request = signed_request(r, survivors)
    with pytest.raises(
        SecAggError, match=f"node {me} refuses to unmask: 2 of its neighbourhood survived, threshold is 3"
    ):
        sa.unmask(r.clients[me], request, ROSTER)


def test_substituted_keys_are_refused_by_every_neighbour_before_any_share_is_sealed():
    """The audit's key substitution: the server hands node v's neighbours keys of its own (so it could
    open their shares of v's secrets and agree v's pair masks). Unsigned, signed by an identity off
    the roster, or v's signed keys moved to another node id: each neighbour refuses to share."""
    p = params()
    clients, advertised = {}, {}
    for u in p.node_ids:
        clients[u], advertised[u] = sa.setup(p, u, IDENTITIES[u])
    victim, other = p.node_ids[0], p.node_ids[1]
    (_, cipher), (_, mask) = keys.new_key_pair(), keys.new_key_pair()
    outsider = identity.new_identity()
    forged = {
        "unsigned": sa.PublicKeys(victim, cipher, mask, IDENTITIES[victim].public, b"\0" * 64),
        "off the roster": sa.PublicKeys(
            victim,
            cipher,
            mask,
            outsider.public,
            outsider.sign(identity.keys_statement(p.digest, victim, cipher, mask)),
        ),
        "another node's": dataclasses.replace(advertised[other], node_id=victim),
    }
    for how, keys_of_victim in forged.items():
        routed = sa.route_keys(p, {**advertised, victim: keys_of_victim})
        entries = sa.transcript({**advertised, victim: keys_of_victim})
        for u in p.neighbours[victim]:
            with pytest.raises(
                SecAggError, match=f"node {u} refuses to share: node {victim}'s keys are not signed"
            ):
                sa.share_keys(clients[u], routed[u], ROSTER, entries, IDENTITIES[u])
            assert clients[u].stage == "keys", how  # nothing sealed, nothing kept


def test_inconsistent_survivor_sets_are_refused_by_every_honest_node():
    """The audit's inconsistent dropped lists: the server tells one half of the round that the victim
    survived (to collect shares of its self-mask) and the other half that it dropped (to collect
    its neighbours' mask keys). Each node signs only the set it was shown, and neither set carries
    a majority's signatures; a set relabelled with the other half's signatures fails too."""
    r = run_to_masked(params(n=10, k=4, t=3))
    ids = r.params.node_ids
    victim = ids[0]
    half_a, half_b = set(ids[:5]), set(ids[5:])
    told_alive, told_dropped = frozenset(ids), frozenset(set(ids) - {victim})
    alive = signed_request(r, told_alive, half_a)
    dropped = signed_request(r, told_dropped, half_b)
    for u in half_a:
        with pytest.raises(
            SecAggError, match=f"node {u} refuses to unmask: 5 valid signatures of the survivor set"
        ):
            sa.unmask(r.clients[u], alive, ROSTER)
    for u in half_b:
        merged = sa.unmask_request(told_dropped, {**alive.signatures, **dropped.signatures})
        with pytest.raises(SecAggError, match=f"node {u} refuses to unmask: 5 valid signatures"):
            sa.unmask(r.clients[u], merged, ROSTER)


def test_every_stage_runs_once_and_in_order():
    r = run_to_masked(params())
    me = r.params.node_ids[0]
    inbox = sa.route_shares(r.params, {})  # any inbox: the stage is refused before it is read
    with pytest.raises(SecAggError, match=f"node {me} refuses the share request: it is past the keys stage"):
        sa.share_keys(r.clients[me], {}, ROSTER, {}, IDENTITIES[me])
    with pytest.raises(SecAggError, match=f"node {me} refuses the mask request: it is past the shared stage"):
        sa.masked_input(r.clients[me], inbox.get(me, {}), r.inputs[me])
    request = signed_request(r, r.params.node_ids)
    with pytest.raises(SecAggError, match="refuses the consistency-check request"):
        sa.check_survivors(r.clients[me], frozenset(r.params.node_ids), IDENTITIES[me])
    sa.unmask(r.clients[me], request, ROSTER)
    fresh = sa.setup(r.params, me, IDENTITIES[me])[0]
    with pytest.raises(SecAggError, match="refuses the unmask request: it is past the checked stage"):
        sa.unmask(fresh, request, ROSTER)


def test_the_server_says_when_too_few_shares_arrived():
    r = run_to_masked(params(n=10, k=4, t=3))
    victim = r.params.node_ids[0]
    request = signed_request(r, r.masked)
    holders = r.params.neighbours[victim]
    silent = set(sorted(holders)[:2])  # 2 of its 4 share holders do not answer: 2 < t = 3 shares
    replies = [sa.unmask(r.clients[u], request, ROSTER) for u in r.params.node_ids if u not in silent]
    with pytest.raises(
        SecAggError, match=f"only 2 shares of node {victim}'s self-mask seed arrived, 3 needed"
    ):
        sa.unmask_sum(r.params, r.advertised, r.shared, r.masked, replies)


def test_misrouted_or_tampered_shares_fail_authentication():
    p = params()
    clients, _, outboxes = share_all(p)
    me = p.node_ids[0]
    inbox = sa.route_shares(p, outboxes)[me]
    a, b = sorted(inbox)[:2]
    swapped = {**inbox, a: inbox[b], b: inbox[a]}  # b's share presented as a's
    with pytest.raises(ShareAuthError, match="failed authentication"):
        sa.masked_input(clients[me], swapped, np.zeros(p.length, dtype=np.int64))
    # the same ciphertext replayed into the next round between the same nodes (fresh keys there)
    later = sa.Params(p.round_number + 1, p.node_ids, p.k, p.threshold, p.bits, p.length, p.public_seed)
    states, _, outboxes_later = share_all(later)
    inbox_later = sa.route_shares(later, outboxes_later)[me]
    assert sa.masked_input(states[me], inbox_later, np.zeros(p.length, dtype=np.int64))[1].shape == (
        p.length,
    )
    with pytest.raises(
        ShareAuthError, match=f"round {later.round_number}: the share from node {a} to node {me} failed"
    ):
        sa.masked_input(states[me], {**inbox_later, a: inbox[a]}, np.zeros(p.length, dtype=np.int64))


def test_inputs_outside_the_modulus_are_refused_not_clipped():
    r = run_to_masked(params(bits=8, d=16))
    client = dataclasses.replace(r.clients[r.params.node_ids[0]], stage="shared")
    for bad, message in [
        (np.full(16, 256), r"input coordinates must lie in \[0, 2\^8\), got \[256, 256\]"),
        (np.full(16, -1), r"input coordinates must lie in \[0, 2\^8\)"),
        (np.zeros(15, dtype=np.int64), r"an input is an integer vector of shape \(16,\)"),
        (np.zeros(16), r"an input is an integer vector of shape \(16,\), got float64"),
    ]:
        with pytest.raises(SecAggError, match=message):
            sa.masked_input(client, {}, bad)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"threshold": 5}, "threshold t=5 exceeds the k=4 shares each node hands out"),
        ({"threshold": 2}, r"threshold t=2 must exceed half of the 4 shares a node hands out \(t > 4/2\)"),
        ({"k": 3, "threshold": 2, "ids": 9}, r"threshold t=2 must exceed half of the 4 shares"),  # k, n odd
        ({"ids": 4}, "4 nodes cannot each have k=4 neighbours: need at least k\\+1=5 nodes"),
        ({"bits": 0}, r"bits per coordinate must be in \[1, 62\], got 0"),
        ({"bits": 63}, r"bits per coordinate must be in \[1, 62\], got 63"),
        ({"k": 1, "threshold": 1}, "each node needs at least 2 neighbours, got k=1"),
        ({"length": 0}, "inputs need at least one coordinate"),
        ({"seed": b"short"}, "the public graph seed needs at least 16 bytes"),
    ],
)
def test_bad_parameters_fail_in_one_line(changes, message):
    fields = {"k": 4, "threshold": 3, "bits": 16, "length": 8, "ids": 10, "seed": os.urandom(32)} | changes
    p = sa.Params(
        3,
        tuple(range(fields["ids"])),
        fields["k"],
        fields["threshold"],
        fields["bits"],
        fields["length"],
        fields["seed"],
    )
    with pytest.raises(FedloraError, match=message) as raised:
        p.validate()
    assert "\n" not in str(raised.value)
    with pytest.raises(SecAggError):
        sa.setup(p, 0, IDENTITIES[0])


def test_odd_k_on_an_even_cohort_takes_the_usual_bound():
    sa.Params(1, tuple(range(10)), 3, 2, 8, 4, os.urandom(32)).validate()  # 3-regular: t=2 > 3/2


def test_the_server_takes_unmask_replies_only_from_survivors():
    r = run_to_masked(params())
    gone = r.params.node_ids[1]
    survivors = {u: y for u, y in r.masked.items() if u != gone}
    request = signed_request(r, survivors)
    replies = [sa.unmask(r.clients[u], request, ROSTER) for u in survivors]
    stray = sa.UnmaskReply(gone, {}, {})
    with pytest.raises(
        SecAggError, match=rf"unmask replies from nodes that sent no masked input: \[{gone}\]"
    ):
        sa.unmask_sum(r.params, r.advertised, r.shared, survivors, [*replies, stray])


def test_signatures_of_another_run_are_not_counted():
    """The audit's replay: the server runs one round honestly, keeps every node's signature of
    "everyone survived", then runs the same parameters and seed again (another run id, or the same:
    the nodes' fresh round keys differ) and tops a minority's signatures up with the old ones. The
    old signatures are bound to the old transcript: every honest node refuses to unmask."""
    first = params(n=10, k=4, t=3)
    old = run_to_masked(first)
    replayed = signed_request(old, old.params.node_ids).signatures
    for run_id in (first.run_id, first.run_id + 1):
        again = run_to_masked(dataclasses.replace(first, run_id=run_id))
        ids = again.params.node_ids
        minority = set(ids[:4])
        fresh = signed_request(again, ids, minority)
        # the old signatures, presented with the old keys and with this run's keys of their signers
        for signers in (replayed, {v: (again.advertised[v], sig) for v, (_, sig) in replayed.items()}):
            request = sa.unmask_request(frozenset(ids), {**signers, **fresh.signatures})
            for u in minority:
                with pytest.raises(
                    SecAggError, match=f"node {u} refuses to unmask: 4 valid signatures of the survivor set"
                ):
                    sa.unmask(again.clients[u], request, ROSTER)


def test_a_signature_counts_only_from_the_identity_that_signed_the_nodes_round_keys():
    """Another roster identity's valid signature of the set, presented for node v, is not v's: it is
    not counted (the aliasing route: two SuperNodes under one node id). One identity presented for
    two signers is refused outright."""
    r = run_to_masked(params(n=10, k=4, t=3))
    ids = r.params.node_ids
    survivors = frozenset(ids)
    request = signed_request(r, survivors, ids[:5])  # 5 of 10: one short of a majority
    alias = identity.new_identity()  # a second SuperNode under node id ids[5], on the roster
    roster = ROSTER | {alias.public}
    statement = identity.survivors_statement(
        r.clients[ids[0]].transcript_digest, ids[5], identity.survivors_digest(survivors)
    )
    aliased = dataclasses.replace(r.advertised[ids[5]], identity=alias.public)
    for presented in (r.advertised[ids[5]], aliased):
        topped = sa.unmask_request(
            survivors, {**request.signatures, ids[5]: (presented, alias.sign(statement))}
        )
        with pytest.raises(SecAggError, match=f"node {ids[0]} refuses to unmask: 5 valid signatures"):
            sa.unmask(r.clients[ids[0]], topped, roster)
    twice = sa.unmask_request(survivors, {**request.signatures, ids[5]: request.signatures[ids[0]]})
    with pytest.raises(SecAggError, match="one identity signs for two nodes"):
        sa.unmask(r.clients[ids[1]], twice, ROSTER)


def test_a_transcript_other_than_the_nodes_own_view_is_refused_before_any_share():
    """The share stage's transcript must list this node's own round keys and exactly the neighbours'
    keys it was sent, as it was sent them, and no node outside the round: otherwise nothing is sealed."""
    p = params()
    clients, advertised = {}, {}
    for u in p.node_ids:
        clients[u], advertised[u] = sa.setup(p, u, IDENTITIES[u])
    me = p.node_ids[0]
    routed, entries = sa.route_keys(p, advertised), sa.transcript(advertised)
    neighbour = min(p.neighbours[me])
    _, cipher = keys.new_key_pair()
    forged_self = {
        **entries,
        me: identity.entry_digest(me, IDENTITIES[me].public, cipher, advertised[me].mask),
    }
    forged_peer = {
        **entries,
        neighbour: identity.entry_digest(
            neighbour, IDENTITIES[9].public, advertised[neighbour].cipher, advertised[neighbour].mask
        ),
    }
    withheld = {v: k for v, k in routed[me].items() if v != neighbour}
    cases = [
        (forged_self, routed[me], f"lists other keys for node {me}"),
        (forged_peer, routed[me], f"lists other keys for node {neighbour}"),
        (entries, withheld, "the transcript lists neighbours"),
        ({**entries, 2**40: b"x" * 32}, routed[me], "names nodes outside the round"),
    ]
    borrowed = dict(routed[me])  # a neighbour's keys signed by this node's own identity for its id
    borrowed[neighbour] = sa.PublicKeys(
        neighbour,
        cipher,
        advertised[neighbour].mask,
        IDENTITIES[me].public,
        IDENTITIES[me].sign(identity.keys_statement(p.digest, neighbour, cipher, advertised[neighbour].mask)),
    )
    cases.append((sa.transcript({**advertised, neighbour: borrowed[neighbour]}), borrowed, "own identity"))
    for transcript, peers, message in cases:
        with pytest.raises(SecAggError, match=f"node {me} refuses to share: .*{message}"):
            sa.share_keys(clients[me], peers, ROSTER, transcript, IDENTITIES[me])
        assert clients[me].stage == "keys"
