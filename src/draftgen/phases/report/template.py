"""The Jinja2 template of report.html (autoescaped; charts and metrics arrive as pre-encoded JSON)."""

from __future__ import annotations

__all__ = ["PAGE"]

PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
:root {
  --bg: #f5f6fa; --card: #ffffff; --ink: #212529; --muted: #6c757d; --line: #e6e8ee;
  --accent: #6d5dfc; --ok: #2b8a3e; --warn: #e8590c; --bad: #e03131;
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", sans-serif; }
header { background: linear-gradient(120deg, #2b2d42 0%, #433d8b 100%); color: #fff; padding: 28px 40px 24px; }
header h1 { margin: 0 0 6px; font-size: 24px; font-weight: 650; letter-spacing: -0.01em; }
header .sub { opacity: .8; font-size: 13px; }
header dl { display: flex; flex-wrap: wrap; gap: 6px 28px; margin: 14px 0 0; font-size: 13px; }
header dt { opacity: .65; text-transform: uppercase; font-size: 11px; letter-spacing: .06em; }
header dd { margin: 0; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
main { max-width: 1360px; margin: 0 auto; padding: 24px 32px 48px; }
h2 { font-size: 17px; margin: 34px 0 12px; font-weight: 650; }
.phases { display: flex; gap: 8px; flex-wrap: wrap; margin-bottom: 18px; }
.pill { border-radius: 999px; padding: 3px 12px; font-size: 12px; border: 1px solid var(--line); background: var(--card); color: var(--muted); }
.pill.done { background: #ebfbee; border-color: #b2f2bb; color: var(--ok); }
.kpis { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 14px; }
.kpi { background: var(--card); border: 1px solid var(--line); border-radius: 12px; padding: 14px 16px; }
.kpi .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .05em; }
.kpi .value { font-size: 24px; font-weight: 650; margin: 2px 0; font-variant-numeric: tabular-nums; }
.kpi .note { color: var(--muted); font-size: 12px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 12px; padding: 6px 8px; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 7px 10px; text-align: right; white-space: nowrap; border-bottom: 1px solid var(--line); }
th { white-space: normal; vertical-align: bottom; font-size: 11.5px; color: var(--muted); font-weight: 600; text-transform: uppercase; letter-spacing: .04em; }
th:first-child, td:first-child { text-align: left; }
tbody tr:hover { background: #f8f9fc; }
tr.total td { font-weight: 650; border-top: 2px solid var(--line); border-bottom: none; }
tr.tag td:first-child { padding-left: 22px; color: var(--muted); }
.bar { display: inline-block; width: 80px; height: 6px; border-radius: 3px; background: #eceff3; vertical-align: middle; margin-right: 8px; overflow: hidden; }
.bar i { display: block; height: 100%; background: var(--accent); }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 16px; }
figure { margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 12px; padding: 8px 10px 10px; }
figcaption { color: var(--muted); font-size: 12px; padding: 0 8px; }
.bad { color: var(--bad); } .ok { color: var(--ok); } .muted { color: var(--muted); }
.alert { border-radius: 10px; padding: 10px 14px; margin: 12px 0; background: #fff5f5; border: 1px solid #ffc9c9; color: var(--bad); }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
.ex td, .ex th { text-align: left; white-space: normal; }
.tok { display: inline-block; border: 1px solid #d0d4dc; background: #f8f9fc; border-radius: 4px; padding: 0 4px; margin: 1px 2px 1px 0; }
.tok.ours { border-color: #ffa8a8; background: #fff5f5; } .tok.ref { border-color: #8ce99a; background: #ebfbee; }
.ctx { color: var(--muted); white-space: pre-wrap; }
.verdict { display: flex; gap: 16px; align-items: flex-start; border-radius: 12px; padding: 14px 18px; margin: 0 0 18px;
  border: 1px solid; }
.verdict .badge { flex: none; font-weight: 750; letter-spacing: .08em; border-radius: 8px; padding: 4px 12px; color: #fff; font-size: 13px; }
.verdict .reason { font-size: 15px; font-weight: 600; }
.verdict ul { margin: 6px 0 0; padding-left: 18px; font-size: 13px; }
.verdict.green { background: #ebfbee; border-color: #8ce99a; } .verdict.green .badge { background: var(--ok); }
.verdict.amber { background: #fff9db; border-color: #ffd43b; } .verdict.amber .badge { background: #f08c00; }
.verdict.red { background: #fff5f5; border-color: #ffa8a8; } .verdict.red .badge { background: var(--bad); }
tr.broken td { background: #fff5f5; } td.broken { color: var(--bad); font-weight: 650; }
tr.warn td { background: #fff9db; }
td.low { background: #fff5f5; color: var(--bad); }
#providers th, #providers td { padding: 7px 7px; }
/* at 1280 px the providers table fits: its cells wrap at their spaces (a figure and its share, p50 / p95) */
#providers td { white-space: normal; } #providers td.kinds { min-width: 9em; }
#accept-table td:first-child .mono { display: block; white-space: normal; word-break: break-all; }
#audit th, #audit td { padding: 7px 6px; } #audit td.pair { white-space: normal; min-width: 7em; }
.sv { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; line-height: 1.9; white-space: pre-wrap;
  word-break: break-word; padding: 10px 12px; }
.sv .seg { display: block; margin: 0 0 6px; }
.sv .seg-label { display: inline-block; font-family: system-ui, sans-serif; font-size: 11px; text-transform: uppercase;
  letter-spacing: .06em; color: #fff; border-radius: 4px; padding: 0 6px; margin-right: 6px; }
.sv .seg-prompt .seg-label { background: #868e96; } .sv .seg-reasoning .seg-label { background: var(--accent); }
.sv .seg-content .seg-label { background: #16a394; }
.sv .t { border-radius: 3px; padding: 1px 0; box-shadow: inset -1px 0 0 rgba(0,0,0,.12); }
.sv .m0 { background: #f1f3f5; color: #495057; }
.sv .seg-reasoning .m1 { background: #e5dbff; } .sv .seg-content .m1 { background: #c3fae8; }
.sv .sp { font-weight: 700; color: #c2255c; }
.sv .skip { font-family: system-ui, sans-serif; color: var(--muted); font-style: italic; margin: 0 6px; }
.legend-chip { display: inline-block; width: 12px; height: 12px; border-radius: 3px; vertical-align: -2px; margin: 0 4px 0 12px; }
footer { color: var(--muted); font-size: 12px; margin-top: 40px; }
</style>
<script>{{ plotly_js | safe }}</script>
</head>
<body>
<header>
  <h1>{{ title }}</h1>
  <div class="sub">generated {{ generated }} · latest activity {{ m.latest_activity | time }}</div>
  <dl>
  {% for k, v in settings.items() %}<div><dt>{{ k }}</dt><dd>{{ v }}</dd></div>{% endfor %}
  </dl>
</header>
<main>
<div class="phases">
{% for ph, done in m.phases.items() %}<span class="pill{{ ' done' if done else '' }}">{{ '✓' if done else '○' }} {{ ph }}</span>{% endfor %}
</div>
{% set v = m.verdict %}
<section class="verdict {{ v.level }}" id="verdict" data-level="{{ v.level }}">
  <span class="badge">{{ {'green': 'GOOD', 'amber': 'CHECK', 'red': 'NOT USABLE'}[v.level] }}</span>
  <div>
    <div class="reason">{{ v.reason }}</div>
    {% set shown = 1 if v.level != 'green' else 0 %}
    {% if (v.problems | length) + (v.warnings | length) > shown %}<ul>
    {% for x in v.problems %}{% if not (loop.first and v.level == 'red') %}<li class="bad">{{ x }}</li>{% endif %}{% endfor %}
    {% for x in v.warnings %}{% if not (loop.first and v.level == 'amber') %}<li>{{ x }}</li>{% endif %}{% endfor %}
    </ul>{% endif %}
    {% if m.audit and m.audit.thresholds_broken %}<div class="bad" style="margin-top: 6px"><b>Audit thresholds broken:</b></div><ul>
    {% for b in m.audit.thresholds_broken %}<li class="bad mono">{{ b }}</li>{% endfor %}
    </ul>{% endif %}
  </div>
</section>
{% for n in notes %}<div class="alert">{{ n }}</div>{% endfor %}

<section class="kpis" id="kpis">
{% for label, value, note in kpis %}
  <div class="kpi"><div class="label">{{ label }}</div><div class="value">{{ value }}</div><div class="note">{{ note }}</div></div>
{% endfor %}
</section>

<h2>Datasets</h2>
<div class="card">
<table id="datasets">
<thead><tr><th>dataset</th><th>done / prepared</th><th>progress</th><th>prompt tokens</th><th>completion tokens</th>
<th>reasoning share</th><th>cost</th><th>$/M output</th><th>truncated</th><th>failed</th><th>mean latency</th></tr></thead>
<tbody>
{% for d in m.datasets + [t] %}
<tr{% if loop.last %} class="total"{% endif %} data-dataset="{{ d.name }}">
<td>{{ d.name }}</td>
<td>{{ d.done | int }} / {{ d.prepared | int }}{% if d.orphans %} <span class="muted" title="records whose sample is no longer in the prepared set: never merged">(+{{ d.orphans | int }} orphans)</span>{% endif %}</td>
<td><span class="bar"><i style="width: {{ '%.1f' % ((d.progress or 0) * 100) }}%"></i></span>{{ d.progress | pct }}</td>
<td>{{ d.prompt_tokens | int }}</td>
<td>{{ d.completion_tokens | int }}</td>
<td>{{ d.reasoning_share | pct }}</td>
<td>{{ d.cost_usd | usd }}</td>
<td>{{ d.usd_per_m_output | usd }}</td>
<td>{{ d.truncated | int }}</td>
<td{% if d.failed %} class="bad"{% endif %}>{{ d.failed | int }}</td>
<td>{{ d.mean_latency_s | dur }}</td>
</tr>
{% endfor %}
</tbody>
</table>
</div>
{% if rounds %}
<h2 id="rounds">Rounds of generation</h2>
{% if rounds.rows %}<div class="card"><table id="rounds-table">
<thead><tr><th>round</th><th>spread</th><th>budget</th><th>started</th>{% for d in rounds.datasets %}<th>{{ d }}: prompts added / done</th>{% endfor %}
<th>merged rows</th><th>acceptance length, measured → expected</th></tr></thead>
<tbody>{% for r in rounds.rows %}<tr data-round="{{ r.round }}">
<td>{{ r.round }}</td><td>{{ r.spread or ('as configured' if r.round == 1 else '–') }}</td>
<td>{% if r.budget is none %}–{% elif r.budget_unit == 'usd' %}{{ r.budget | usd }}{% else %}{{ r.budget | num(0) }} {{ r.budget_unit }}{% endif %}</td>
<td>{% if r.round == 1 %}–{% elif r.started_at is not none %}{{ r.started_at | time }}{% else %}proposed{% endif %}</td>
{% for c in r.datasets %}<td title="{{ c.prepared }} drawn">{{ c.added | int }} / {{ c.done | int }}{% if c.expected_acceptance_length is not none %} <span class="muted">→ AL {{ c.expected_acceptance_length | num(3) }}</span>{% endif %}</td>{% endfor %}
<td>{{ r.merged_rows | int }}</td>
<td>{% if r.weighted_expected is not none %}{{ r.weighted_now | num(3) }} → {{ r.weighted_expected | num(3) }}{% else %}–{% endif %}</td></tr>{% endfor %}</tbody>
</table></div>
<p class="muted">Round 1 is the run as configured; each later round is <code>plan --next-round</code>'s proposal
(rounds/round-&lt;n&gt;.json), started by <code>generate --round N</code>. Prompts added: the proposal's per dataset
(round 1: those drawn); done: those with a response. The acceptance lengths are traffic-weighted over the datasets,
the expected one is the proposal's model; → AL per dataset: what it expected for that dataset.</p>{% endif %}
{% for n in rounds.notes %}<p class="muted">note: {{ n }}</p>{% endfor %}
{% endif %}

<h2>Providers</h2>
{% if m.providers_table %}
<div class="card">
<table id="providers">
{% set att = (m.providers_table | sum(attribute='attempts')) > 0 %}
{% set ttft = m.providers_table | selectattr('ttft_p50_s', 'ne', none) | list | length > 0 %}
{% set tiers = m.providers_table | selectattr('service_tiers') | list | length > 0 %}
<thead><tr><th>provider</th><th>quantization</th>{% if tiers %}<th>service tier</th>{% endif %}<th>responses</th>{% if att %}<th>retries / attempts</th>
<th>retries by kind</th>{% endif %}<th>dropped reasoning</th><th>cool-downs</th><th>completion tokens</th><th>cost</th><th>$/M output</th>
<th>latency p50 / p95</th>{% if ttft %}<th>TTFT p50 / p95</th>{% endif %}</tr></thead>
<tbody>
{% for p in m.providers_table %}
<tr{% if p.cooldowns or p.dropped_reasoning %} class="warn"{% endif %} data-provider="{{ p.provider }}">
<td>{{ p.provider }}</td><td class="mono">{{ p.quantization or '–' }}</td>{% if tiers %}<td class="mono">{{ p.service_tiers or '–' }}</td>{% endif %}
<td>{{ p.responses | int }} <span class="muted">({{ p.share | pct }})</span></td>
{% if att %}<td>{{ p.retries | int }} / {{ p.attempts | int }}{% if p.failure_rate %} <span class="muted">({{ p.failure_rate | pct }})</span>{% endif %}</td>
<td class="mono kinds">{% for k, n in p.failures_by_kind.items() %}{{ k }} {{ n }}{% if not loop.last %}, {% endif %}{% else %}–{% endfor %}</td>{% endif %}
<td{% if p.dropped_reasoning %} class="broken"{% endif %}>{{ p.dropped_reasoning | int }}</td>
<td{% if p.cooldowns %} class="broken"{% endif %}>{{ p.cooldowns | int }}</td>
<td>{{ p.completion_tokens | int }}</td><td>{{ p.cost_usd | usd }}</td><td>{{ p.usd_per_m_output | usd }}</td>
<td>{{ p.latency_p50_s | secs }} / {{ p.latency_p95_s | secs }}</td>{% if ttft %}<td>{{ p.ttft_p50_s | secs }} / {{ p.ttft_p95_s | secs }}</td>{% endif %}
</tr>
{% endfor %}
</tbody>
</table>
</div>
<p class="muted">{% if att %}Retries are failed attempts (logs/attempts.jsonl). {% else %}No logs/attempts.jsonl in this run:
attempts and retries per provider are not known. {% endif %}Dropped reasoning: reasoning tokens billed but no reasoning
text returned. Percentiles interpolate linearly{% if ttft %}; TTFT is the time to the first byte of the answer{% endif %}.{% if tiers %}
Service tier: the tier each response says served it (<code>batch</code>: OpenRouter's Batch API), priced at that tier.{% endif %}</p>
{% else %}
<p class="muted">No responses yet.</p>
{% endif %}

<h2>Charts</h2>
<div class="grid">
{% for div, caption, fig, height in figures %}
<figure><div id="{{ div }}" class="chart" style="height:{{ height }}px"></div><figcaption>{{ caption }}</figcaption></figure>
{% endfor %}
</div>

<h2>Responses</h2>
<div class="grid">
<div class="card"><table>
<thead><tr><th>reasoning came back in</th><th>responses</th></tr></thead>
<tbody>{% for k, v in t.reasoning_fields.items() %}<tr><td class="mono">{{ k }}</td><td>{{ v | int }}</td></tr>{% endfor %}</tbody>
<thead><tr><th>finish reason</th><th>responses</th></tr></thead>
<tbody>{% for k, v in t.finish_reasons.items() %}<tr><td class="mono">{{ k }}</td><td>{{ v | int }}</td></tr>{% endfor %}</tbody>
</table></div>
<div class="card"><table>
<thead><tr><th>token ids obtained</th><th>responses</th></tr></thead>
<tbody>{% for k, v in t.ids_source.items() %}<tr><td class="mono">{{ k }}</td><td>{{ v | int }}</td></tr>{% endfor %}</tbody>
<thead><tr><th>reconstruction flag</th><th>responses</th></tr></thead>
<tbody>{% for k, v in t.recon_flags.items() %}<tr><td class="mono">{{ k }}</td><td>{{ v | int }}</td></tr>{% else %}<tr><td class="muted">none</td><td></td></tr>{% endfor %}</tbody>
</table></div>
</div>

<h2>Audit</h2>
{% if audit %}
<div class="card">
<table id="audit">
{% set kept_col = audit | selectattr('billing_disagreement_kept', 'ne', none) | list | length > 0 %}
<thead><tr><th>dataset</th><th>records</th><th>excluded</th><th>structural failures</th><th>rebuilt / billed tokens</th>
<th>billing disagreement</th>{% if kept_col %}<th>billing disagreement, kept rows</th>{% endif %}<th>mismatched samples</th><th>BPE compared</th><th>exact</th><th>tokenization</th><th>semantic</th></tr></thead>
<tbody>
{% for a in audit %}
<tr class="{{ 'total' if loop.last else '' }}{{ ' broken' if a.broken else '' }}" data-audit="{{ a.dataset }}"{% if a.broken %} title="breaks the audit threshold of: {{ a.broken | join(', ') }}"{% endif %}>
<td>{{ a.dataset }}</td><td>{{ a.records | int }}</td><td>{{ a.excluded | int }}</td>
<td class="{{ 'broken' if 'structural' in a.broken else ('bad' if a.structural_failures else '') }}">{{ a.structural_failures | int }}</td>
<td class="pair">{{ a.rebuilt | int }} / {{ a.billed | int }}</td>
{% if kept_col %}<td>{{ a.billing_disagreement | pct(3) }}</td>
<td{% if 'billing' in a.broken %} class="broken"{% endif %}>{{ a.billing_disagreement_kept | pct(3) }}</td>
{% else %}<td{% if 'billing' in a.broken %} class="broken"{% endif %}>{{ a.billing_disagreement | pct(3) }}</td>{% endif %}
<td>{{ a.billing_mismatched_samples | int }}</td><td>{{ a.reference_compared | int }}</td><td>{{ a.exact_match | int }}</td>
<td{% if 'tokenization' in a.broken %} class="broken"{% endif %}>{{ a.tokenization_mismatch | int }}</td>
<td class="{{ 'broken' if 'semantic' in a.broken else ('bad' if a.semantic_mismatch else '') }}">{{ a.semantic_mismatch | int }}</td>
</tr>
{% endfor %}
</tbody>
</table>
</div>
{% if examples %}
<h2>BPE mismatch examples</h2>
<div class="card"><table class="ex" id="mismatches">
<thead><tr><th>sample</th><th>kind</th><th>position</th><th>in context: ours (red) and the reference (green)</th></tr></thead>
<tbody>{% for e in examples %}
<tr><td class="mono">{{ e.sample_id }}{% if e.dataset %}<br><span class="muted">{{ e.dataset }}</span>{% endif %}</td>
<td>{{ e.kind }}{% if e.cause %}<br><span class="muted">{{ e.cause }}</span>{% endif %}</td><td>{{ e.position }}</td>
<td class="mono"><div><span class="ctx">{{ e.before | ctx }}</span>{% for x in e.ours %}<span class="tok ours">{{ x | tok }}</span>{% else %}<span class="tok ours muted">(nothing)</span>{% endfor %}<span class="ctx">{{ e.after | ctx }}</span></div>
<div><span class="ctx">{{ e.before | ctx }}</span>{% for x in e.reference %}<span class="tok ref">{{ x | tok }}</span>{% else %}<span class="tok ref muted">(nothing)</span>{% endfor %}<span class="ctx">{{ e.after | ctx }}</span></div></td></tr>
{% endfor %}</tbody></table></div>
{% endif %}
{% else %}
<p class="muted">No audit yet: run <code>draftgen audit CONFIG</code> (or <code>draftgen run CONFIG</code>).</p>
{% endif %}

<h2>Merged training data</h2>
{% if m.merged %}
<div class="card">
<table id="merged">
<thead><tr><th>dataset</th><th>records</th><th>rows</th><th>train</th><th>validation</th><th>completion tokens</th>
<th>reasoning share</th><th>supervised tokens</th><th>capped</th><th>orphans</th><th>dropped</th></tr></thead>
<tbody>
{% for d in m.merged.datasets + [m.merged.total] %}
<tr{% if loop.last %} class="total"{% endif %}>
<td>{{ d.dataset }}</td><td>{{ d.records | int }}</td><td>{{ d.samples | int }}</td><td>{{ d.train | int }}</td>
<td>{{ d.validation | int }}</td><td>{{ d.completion_tokens | int }}</td><td>{{ d.reasoning_share | pct }}</td>
<td>{{ d.supervised_tokens | int }}</td><td>{{ d.capped | int }}</td>
<td{% if d.orphans %} class="bad" title="records not in the current prepared set: never merged"{% endif %}>{{ d.orphans | int }}</td>
<td class="mono">{% for k, v in d.dropped.items() %}{{ k }} {{ v }}{% if not loop.last %}, {% endif %}{% else %}–{% endfor %}</td>
</tr>
{% endfor %}
</tbody>
</table>
</div>
{% if m.merged.hidden_states %}{% set h = m.merged.hidden_states %}
<p>Hidden states for EAGLE-3 training ({{ h.slots }} slots × hidden {{ h.hidden_size | int }} × {{ h.dtype }}):
<b>{{ h.bytes | bytes }}</b> for {{ h.tokens | int }} tokens (fp8 {{ h.by_dtype['fp8'] | bytes }},
bf16 {{ h.by_dtype['bf16'] | bytes }}){% if h.cap_saved %}; the length cap of {{ h.max_seq_len | int }} tokens saves {{ h.cap_saved | bytes }}{% endif %}.</p>
{% endif %}
<div class="card"><table>
<thead><tr><th>file</th><th>split</th><th>kind</th><th>rows</th><th>size</th></tr></thead>
<tbody>{% for f in m.merged_files %}<tr><td class="mono">{{ f.path }}</td><td>{{ f.split }}</td><td>{{ f.kind }}</td>
<td>{{ f.rows | int }}</td><td>{{ f.bytes | bytes }}</td></tr>{% endfor %}</tbody>
</table></div>
{% for n in m.merged.notes %}<p class="muted">note: {{ n }}</p>{% endfor %}
{% if sample %}{% set s = sample %}
<h2>Sample</h2>
<div class="card" id="sample-viewer">
<p style="margin: 8px 12px 0"><span class="mono">{{ s.sample_id }}</span> <span class="muted">({{ s.dataset }}, {{ s.file }})</span>:
{{ s.prompt_len | int }} prompt + {{ s.reasoning_len | int }} reasoning + {{ s.completion_len - s.reasoning_len }} content tokens,
{{ s.supervised | int }} supervised{% if s.capped %}, cut at max_seq_len{% endif %}; {{ s.shown | int }} shown.
<span class="legend-chip" style="background:#f1f3f5"></span>loss_mask 0
<span class="legend-chip" style="background:#e5dbff"></span>1 (reasoning)
<span class="legend-chip" style="background:#c3fae8"></span>1 (content)
<span class="sv"><span class="t sp">&lt;control&gt;</span></span></p>
<div class="sv">{% for seg in s.segments %}<span class="seg seg-{{ seg.name }}" data-segment="{{ seg.name }}"><span class="seg-label">{{ seg.name }} {{ seg.start }}–{{ seg.end }}</span>
{%- for t in seg.head %}<span class="t m{{ t.mask }}{{ ' sp' if t.special else '' }}">{{ t.text }}</span>{% endfor -%}
{% if seg.skipped %}<span class="skip">… {{ seg.skipped | int }} tokens …</span>{% endif -%}
{% for t in seg.tail %}<span class="t m{{ t.mask }}{{ ' sp' if t.special else '' }}">{{ t.text }}</span>{% endfor %}</span>{% endfor %}</div>
</div>
{% endif %}
{% else %}
<p class="muted">Not merged yet: run <code>draftgen merge CONFIG</code> (or <code>draftgen run CONFIG</code>).</p>
{% endif %}

{% if chain and not chain.empty %}{% set h = chain.hidden %}{% set tr = chain.train %}{% set ac = chain.accept %}
<h2 id="extract">Hidden states (extract)</h2>
{% if h %}<div class="card"><table id="extract-table">
<thead><tr><th>hidden set</th><th>samples</th><th>tokens</th><th>flagged</th><th>layers (vLLM ids)</th><th>dtype</th>
<th>backend</th><th>tokens / s</th><th>teacher-checked</th></tr></thead>
<tbody><tr><td class="mono" style="white-space: normal">{{ chain.hidden_path }}{% if not h.complete %} <span class="bad">(incomplete)</span>{% endif %}</td>
<td>{{ h.counts.samples | int }}</td><td>{{ h.counts.tokens | int }}</td>
<td{% if h.counts.flagged %} class="bad"{% endif %}>{{ h.counts.flagged | int }}{% for k, n in h.checks.failed_by_check.items() %}{% if loop.first %} <span class="muted">({% endif %}{{ k }} {{ n }}{% if not loop.last %}, {% else %})</span>{% endif %}{% endfor %}</td>
<td>{{ h.layer_ids.aux | join(', ') }} + final {{ h.layer_ids.final }}</td><td>{{ h.dtype }}</td><td>{{ h.backend }}</td>
<td>{{ h.throughput_tokens_per_s | num(0) }}</td><td>{{ h.checks.teacher_checked | int }}</td></tr></tbody>
</table></div>
{% if h.checks.fidelity %}{% set fid = h.checks.fidelity %}
<h3>Provider fidelity</h3>
<div class="card"><table id="fidelity-table">
<thead><tr><th>provider</th><th>samples / rows</th><th>positions</th><th>target's top-1 agreement</th><th>mean log p</th>
<th>best − it (top-1)</th><th>flagged</th></tr></thead>
<tbody>{% for p in fid.providers %}<tr{% if p.flagged %} class="broken"{% endif %}><td>{{ p.provider }}</td>
<td>{{ p.samples | int }} / {{ p.rows | int }}</td><td>{{ p.positions | int }}</td>
<td>{{ p.top1 | num(3) }} <span class="muted">{{ p.top1_ci95 | ci }}</span></td>
<td>{{ p.logprob_mean | num(3) }} <span class="muted">{{ p.logprob_ci95 | ci }}</span></td>
<td>{% if p.provider == fid.best %}best{% else %}{{ p.top1_gap | num(3) }} <span class="muted">{{ p.top1_gap_ci95 | ci(true) }}</span>{% endif %}</td>
<td{% if p.flagged %} class="bad"{% endif %}>{% if p.flagged %}yes{% if p.excluded_sample_ids %}: {{ p.excluded_sample_ids | length }} rows left out of training{% endif %}{% else %}no{% endif %}</td></tr>{% endfor %}</tbody>
</table></div>
<p class="muted">The target's own final norm and head on each measured sample's stored final state, scored against the
ids the provider emitted (95% bootstrap intervals over samples). Flagged: the interval of the best provider's top-1
agreement minus this one's lies wholly above {{ fid.margin }} (hidden_states.fidelity_margin); action: {{ fid.action }}.</p>
{% endif %}
{% else %}<p class="muted">No hidden set of this run.</p>{% endif %}

<h2 id="train">Drafter training (train)</h2>
{% if tr %}<div class="card"><table id="train-table">
<thead><tr><th>drafter</th><th>algorithm</th><th>samples trained / asked</th><th>steps</th><th>time</th>
<th>final validation loss</th><th>offline AL estimate</th></tr></thead>
<tbody><tr{% if tr.exit_code %} class="broken"{% endif %}><td class="mono" style="white-space: normal">{{ tr.checkpoint or 'not published' }}</td>
<td>{{ tr.algorithm }}, k {{ tr.ttt_steps }}</td>
<td>{% if tr.samples_trained is not none %}{{ tr.samples_trained | int }} / {{ tr.samples_asked | int }}{% else %}–{% endif %}</td>
<td>{{ tr.last_step | int }}</td><td>{{ tr.seconds | dur }}</td>
<td>{% if tr.final_val %}{{ tr.final_val.loss | num(4) }}{% else %}–{% endif %}</td><td>{{ tr.offline_al | num(3) }}</td></tr></tbody>
</table></div>
<p class="muted">{{ tr.message }}</p>
{% else %}<p class="muted">No train/train.json in this run.</p>{% endif %}

<h2 id="accept">Acceptance (accept)</h2>
{% if ac %}{% set a = ac.acceptance %}
<p id="accept-verdict"{% if accept_beats is sameas false %} class="bad"{% endif %}><b>{{ accept_verdict or 'No verdict: this pass has no paired comparison with the no-model drafters.' }}</b></p>
<div class="card"><table id="accept-table">
<thead><tr><th>drafter, same {{ ac.prompts | int }} held-out prompts</th><th>how</th><th>acceptance length</th><th>95% interval</th>
<th>drafter minus it</th><th>95% interval</th>{% for i in range(ac.k or (a.per_position | length)) %}<th>position {{ i + 1 }}</th>{% endfor %}</tr></thead>
<tbody>
<tr data-drafter="drafter" class="total"><td>the drafter <span class="muted mono">{{ ac.drafter }}</span></td><td>{{ a.source }}</td>
<td>{{ a.acceptance_length | num(3) }}</td><td>{{ a.ci95 | ci }}</td><td></td><td></td>
{% for v in a.per_position %}<td>{{ v | num(3) }}</td>{% endfor %}</tr>
{% for alt in ac.alternatives %}{% set c = comparisons.get(alt.name) %}
<tr data-drafter="{{ alt.name }}"><td>{{ alt.name }}</td><td>{{ alt.how }}</td><td>{{ alt.acceptance_length | num(3) }}</td><td>{{ alt.ci95 | ci }}</td>
<td>{% if c %}{{ '%+.3f' % c.difference }}{% endif %}</td><td>{% if c %}{{ c.ci95 | ci(True) }}{% endif %}</td>
{% for v in alt.per_position %}<td>{{ v | num(3) }}</td>{% endfor %}</tr>
{% endfor %}
{% set best = comparisons.get('no-model') %}{% if best %}
<tr data-drafter="no-model"><td>max(copy-last, lookup)</td><td>in each resample</td><td></td><td></td>
<td>{{ '%+.3f' % best.difference }}</td><td>{{ best.ci95 | ci(True) }}</td></tr>{% endif %}
</tbody></table></div>
{% if ac.datasets %}<div class="card" style="margin-top: 12px"><table id="accept-datasets">
<thead><tr><th>dataset</th><th>prompts</th><th>drafter</th><th>95% interval</th>{% for alt in ac.alternatives %}<th>{{ alt.name }}</th>{% endfor %}</tr></thead>
<tbody>{% for d in ac.datasets %}{% for x in [d] + (ac.tags | selectattr('dataset', 'equalto', d.dataset) | list) %}
<tr data-dataset="{{ x.dataset }}"{% if x.tag is not none %} data-tag="{{ x.tag }}" class="tag"{% endif %}><td>{{ x.dataset }}{% if x.tag is not none %} / {{ x.tag | tag }}{% endif %}</td><td>{{ x.prompts | int }}</td>
<td>{{ x.acceptance_length | num(3) }}</td><td>{{ x.ci95 | ci }}</td>
{% for alt in ac.alternatives %}<td>{{ x.alternatives.get(alt.name) | num(3) }}</td>{% endfor %}</tr>{% endfor %}{% endfor %}</tbody>
</table></div>{% if ac.tags %}<p class="muted">dataset / tag: the dataset's held-out prompts that carry the tag
(<code>datasets[].tags_field</code>; a prompt of several tags counts in each).</p>{% endif %}{% endif %}
{% set bl = chain.by_length %}{% if bl %}{% set lo = a.ci95[0] if a.ci95 else none %}
{% if bl.buckets %}<div class="card" style="margin-top: 12px"><table id="accept-lengths">
<thead><tr><th>dataset</th><th>share of training tokens (supervised)</th><th>acceptance length [95% interval]</th>
{% for b in bl.buckets %}<th>prompts of {{ b }} tokens</th>{% endfor %}</tr></thead>
<tbody>{% for r in bl.rows %}<tr data-lengths="{{ r.dataset }}"{% if r.tag is not none %} data-tag="{{ r.tag }}" class="tag"{% elif loop.last %} class="total"{% endif %}><td>{{ r.dataset }}{% if r.tag is not none %} / {{ r.tag | tag }}{% endif %}</td>
<td>{% if r.training_share is not none %}<span class="bar"><i style="width: {{ '%.1f' % (r.training_share * 100) }}%"></i></span>{{ r.training_share | pct }} <span class="muted">({{ r.supervised_tokens | int }})</span>{% else %}–{% endif %}</td>
<td>{{ r.acceptance_length | num(3) }}{% if r.ci95 %} <span class="muted">{{ r.ci95 | ci }}</span>{% endif %}</td>
{% for b in bl.buckets %}{% set c = r.cells.get(b) %}<td{% if c and c.acceptance_length is not none and lo is not none and c.acceptance_length < lo %} class="low" title="below the pass's 95% interval"{% endif %}>{% if c %}{{ c.acceptance_length | num(3) }} <span class="muted">n={{ c.prompts }}</span>{% else %}–{% endif %}</td>{% endfor %}</tr>{% endfor %}</tbody>
</table></div>
<p class="muted">Per dataset and prompt length (prompt tokens with the chat template): 1 + accepted / drafts over the
held-out prompts of the cell that have their own counters ({{ bl.source }}{% if bl.uncounted %}; {{ bl.uncounted }} without them left out{% endif %}),
n prompts each; red: below the lower end of the whole pass's 95% interval. Share of training tokens: the dataset's
loss-masked tokens in merged/ over all of them (merged/stats.json; – before a merge){% if bl.rows | rejectattr('tag', 'none') | list %};
a dataset / tag row's is an estimate, the dataset's × the tag's share of its drawn prompts (merged/ keeps no tags){% endif %}.</p>{% endif %}
{% for n in bl.notes %}<p class="muted">note: {{ n }}</p>{% endfor %}{% endif %}
<p class="muted">Acceptance length: 1 + accepted / drafts over the prompts ({{ ac.server }}, max_tokens {{ ac.max_tokens | int }});
per position: the share of drafts whose token at that position was accepted. copy-last and lookup need no model: they are
replayed on the target's greedy output of the same pass; zero-aux is the same drafter fed zeroed aux states. Intervals:
95% bootstrap over the prompts, the differences paired by prompt.{% if ac.offline_al is not none %} Offline estimate from
training: {{ ac.offline_al | num(3) }}.{% endif %}</p>
{% for w in ac.warnings %}<div class="alert">{{ w }}</div>{% endfor %}
{% set kc = ac.k_choice %}{% if kc and kc.by_k %}<div class="card" style="margin-top: 12px"><table id="accept-by-k">
<thead><tr><th>k</th><th>acceptance length</th><th>95% interval</th>{% for c in kc.concurrencies %}<th>expected speedup, concurrency {{ c }}</th>{% endfor %}</tr></thead>
<tbody>{% for f in kc.by_k %}<tr data-k="{{ f.k }}"{% if f.k == kc.recommended_k %} class="total"{% endif %}>
<td>{{ f.k }}{% if f.k == kc.recommended_k %} (recommended){% endif %}{% if f.k == kc.served_k %} (served){% endif %}</td>
<td>{{ f.acceptance_length | num(3) }}</td><td>{{ f.ci95 | ci }}</td>
{% for c in kc.concurrencies %}<td{% if f.speedup.get(c, 1) < 1 %} class="bad"{% endif %}>{{ f.speedup.get(c) | num(2) }}×</td>{% endfor %}</tr>{% endfor %}</tbody>
</table></div>
<p class="muted">Acceptance length at k: 1 + the accepted shares of positions 1 to k (a position is accepted only when
every one before it is), from the same pass. {% for n in kc.notes %}{{ n }}. {% endfor %}</p>
{% for w in kc.warnings %}<div class="alert">{{ w }}</div>{% endfor %}{% endif %}
{% else %}<p class="muted">No accept/acceptance.json (the run's own drafter over accept.prompts prompts) yet.</p>{% endif %}
{% if chain.passes %}<div class="card"><table id="accept-passes">
<thead><tr><th>pass (accept/…)</th><th>server</th><th>prompts</th><th>acceptance length</th><th>95% interval</th><th>measured</th></tr></thead>
<tbody>{% for p in chain.passes %}<tr{% if p.latest %} class="total"{% endif %} data-latest="{{ 'yes' if p.latest else 'no' }}">
<td class="mono" style="white-space: normal">{{ p.path }}{% if p.latest %} (the latest){% endif %}</td><td>{{ p.server }}</td><td>{{ p.prompts | int }}</td>
<td>{{ p.acceptance_length | num(3) }}</td><td>{{ p.ci95 | ci }}</td><td>{{ p.created_at | time }}</td></tr>{% endfor %}</tbody>
</table></div>{% endif %}
{% for n in chain.notes %}<p class="muted">note: {{ n }}</p>{% endfor %}
{% endif %}

<footer>
Every number on this page is computed from the files of <code>{{ m.run_dir }}</code> and embedded below as JSON
(<code>#draftgen-metrics</code>); <code>draftgen status {{ m.run_dir }}</code> shows the same figures in a terminal.
</footer>
</main>
<script type="application/json" id="draftgen-metrics">{{ metrics_json | safe }}</script>
{% if chain and not chain.empty %}<script type="application/json" id="draftgen-chain">{{ chain_json | safe }}</script>{% endif %}
{% if rounds %}<script type="application/json" id="draftgen-rounds">{{ rounds_json | safe }}</script>{% endif %}
{% for div, caption, fig, height in figures %}
<script type="application/json" id="{{ div }}-data">{{ fig | safe }}</script>
{% endfor %}
<script>
(function () {
  var charts = document.querySelectorAll(".chart");
  for (var i = 0; i < charts.length; i++) {
    var el = charts[i];
    var fig = JSON.parse(document.getElementById(el.id + "-data").textContent);
    Plotly.newPlot(el, fig.data, fig.layout, {displaylogo: false, responsive: true});
  }
})();
</script>
</body>
</html>
"""
