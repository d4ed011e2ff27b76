"""The end-of-run summary as the console prints it."""

from __future__ import annotations


def format_summary(s: dict) -> str:
    """Readable end-of-run summary."""
    metric = s["metric"]
    lines = [
        "",
        f"fedlora run summary  ({s['model']} on {s['dataset']}, mechanism {s['mechanism']})",
        f"  rounds             {s['rounds_completed']} completed, {s['rounds_skipped']} skipped (nobody sampled)"
        + (f", interrupted by a crash: {s['rounds_interrupted']}" if s.get("rounds_interrupted") else ""),
        *(
            [f"  withheld           {s['rounds_withheld']} round(s) with too few usable replies"]
            if s.get("rounds_withheld")
            else []
        ),
        f"  clients            {s['num_clients']} nodes, sample rate p = {s['sample_rate']}",
        *(
            [
                "  dropouts           "
                + "; ".join(
                    f"round {d['round']}: node(s) {', '.join(map(str, d['nodes']))}" for d in s["dropouts"]
                )
            ]
            if s.get("dropouts")
            else []
        ),
        f"  held-out {metric:<9} {s['before'][metric]:.4f} before -> {s['after'][metric]:.4f} after"
        f"  ({s['eval_examples']} examples)",
        f"  bytes per round    {s['bytes_down_per_round'] / 1e6:.2f} MB down, "
        f"{s['bytes_up_per_round'] / 1e6:.2f} MB up (mean over completed rounds)",
        f"  client privacy     {s['privacy']}",
        *(
            [f"  sample privacy     {s['sample_privacy']}"]
            if s.get("sample_privacy", "none").startswith("sample")
            else []
        ),
        *(
            f"  node {n['node']:<14} sample-level epsilon {n['eps_tight']:.4g} (pld) / {n['eps_gdp']:.4g} "
            f"(gdp) at delta {n['delta']:g}, from its ledger"
            for n in s.get("node_privacy", [])
        ),
        *(f"  not covered        {what}" for what in s.get("not_covered", [])),
        *([f"  stopped early      {s['stopped']}"] if s.get("stopped") else []),
        *([f"  privacy report     {', '.join(s['privacy_report'])}"] if s.get("privacy_report") else []),
        f"  wall time          {s['wall_time_s']:.1f} s",
        f"  adapter            {s['adapter']}",
        f"  metrics            {s['metrics_file']}",
    ]
    return "\n".join(lines)
