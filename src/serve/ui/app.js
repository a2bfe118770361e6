// tessera's live view: polls GET /ui/state every UPDATE_MS and draws it; the prompt
// box streams POST /v1/completions (Server-Sent Events) into the page. What the
// browser test reads is kept in window.tesseraUi (update times, streamed chunks).
'use strict';

const UPDATE_MS = 1000;
const ui = (window.tesseraUi = { updates: [], failures: 0, chunks: 0, streamDone: false });

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; ++i; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + ' ' + units[i];
}

function ms(seconds) {
  if (seconds === null || seconds === undefined) return '–';
  return seconds >= 1 ? seconds.toFixed(2) + ' s' : (seconds * 1000).toFixed(1) + ' ms';
}

function duration(s) {
  if (s < 60) return s.toFixed(0) + ' s';
  if (s < 3600) return (s / 60).toFixed(0) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}

// Generation tokens per second between the last two updates.
let previous = null;

function drawCards(state, now) {
  const s = state.scheduler;
  $('running').textContent = s.running;
  $('waiting').textContent = s.waiting;
  $('kv-usage').textContent = (100 * s.kv_usage).toFixed(1) + ' %';
  $('kv-bar').style.width = (100 * s.kv_usage).toFixed(1) + '%';
  $('kv-blocks').textContent = `${s.kv_blocks_used} / ${s.kv_blocks_total} blocks of ` +
      `${state.kv_block_size} tokens · ${s.kv_blocks_cached} cached`;
  $('steps').textContent = s.steps_total;
  $('finished').textContent = s.requests_finished_total;
  if (previous) {
    const dt = (now - previous.at) / 1000;
    const rate = dt > 0 ? (s.generation_tokens_total - previous.tokens) / dt : 0;
    $('tok-rate').textContent = rate.toFixed(1);
  }
  previous = { at: now, tokens: s.generation_tokens_total };
  const m = state.latency.last_minute;
  $('ttft').textContent = ms(m.ttft_p50_s);
  $('tpot').textContent = ms(m.tpot_p50_s);
}

function stack(parts) {
  const bar = el('div', { class: 'stack' });
  for (const [cls, fraction, title] of parts) {
    const pct = Math.max(0, Math.min(100, 100 * fraction));
    bar.append(el('span', { class: cls, style: `width:${pct.toFixed(2)}%`, title }));
  }
  return bar;
}

function drawRanks(state) {
  const body = $('ranks').querySelector('tbody');
  body.replaceChildren();
  for (const r of state.ranks) {
    const iv = r.interval;
    let bar = el('span', { class: 'muted' }, 'waiting for a second sample');
    let rate = '–', c = '–', m = '–', w = '–';
    if (iv && iv.seconds > 0) {
      const f = (x) => x / iv.seconds;
      bar = stack([['compute', f(iv.compute_s), 'compute'], ['comm', f(iv.comm_s), 'communication'],
                   ['wait', f(iv.wait_s), 'waiting']]);
      rate = (iv.steps / iv.seconds).toFixed(1);
      const per = (x) => (iv.steps > 0 ? ms(x / iv.steps) : '–');
      c = per(iv.compute_s); m = per(iv.comm_s); w = per(iv.wait_s);
    }
    const t = r.total;
    const total = t.compute_s + t.comm_s + t.wait_s;
    const share = (x) => (total > 0 ? ((100 * x) / total).toFixed(0) : '0');
    body.append(el('tr', { 'data-rank': r.rank },
        el('td', {}, String(r.rank)), el('td', {}, String(r.stage)), el('td', {}, String(r.tp_rank)),
        el('td', { class: 'small' }, r.links || 'local'), el('td', { class: 'num' }, rate),
        el('td', {}, bar), el('td', { class: 'num' }, c), el('td', { class: 'num' }, m),
        el('td', { class: 'num' }, w),
        el('td', { class: 'num' }, `${share(t.compute_s)} / ${share(t.comm_s)} / ${share(t.wait_s)} %`)));
  }
  const age = state.ranks_age_s;
  $('ranks-note').textContent = age === null ? 'no sample yet'
      : `per step, over the last poll interval · sampled ${age.toFixed(1)} s ago` +
        (age > 5 ? ' (idle: the ranks are polled after steps)' : '');
  const groups = state.groups.map((g) => `${g.kind} group ${g.index}: ranks ${g.ranks.join(', ')}`);
  $('groups').textContent = groups.length ? groups.join(' · ') : 'one rank: no groups';
}

function drawLedger(state) {
  const body = $('ledger').querySelector('tbody');
  body.replaceChildren();
  if (state.ledger.length === 0) {
    body.append(el('tr', {}, el('td', { colspan: 6, class: 'muted' }, 'no communication (one rank)')));
    return;
  }
  for (const row of state.ledger) {
    body.append(el('tr', {},
        el('td', {}, row.group), el('td', {}, row.primitive),
        el('td', { class: 'num' }, String(row.calls)), el('td', { class: 'num' }, bytes(row.bytes_sent)),
        el('td', { class: 'num' }, bytes(row.bytes_received)),
        el('td', { class: 'small' }, row.bytes_sent_by_rank.map(bytes).join(' · '))));
  }
}

function drawLatency(state) {
  const svg = $('latency');
  const W = 600, H = 160, pad = 4;
  const buckets = state.latency.buckets;
  const n = buckets.length;
  const maxOf = (key) => Math.max(1e-9, ...buckets.map((b) => b[key] || 0));
  const ttftMax = maxOf('ttft_mean_s'), tpotMax = maxOf('tpot_mean_s'), reqMax = maxOf('requests');
  const x = (i) => pad + ((W - 2 * pad) * (i + 0.5)) / n;
  const y = (v, max) => H - pad - ((H - 2 * pad) * v) / max;
  const ns = 'http://www.w3.org/2000/svg';
  const parts = [];
  buckets.forEach((b, i) => {
    if (!b.requests) return;
    const r = document.createElementNS(ns, 'rect');
    const h = ((H - 2 * pad) * b.requests) / reqMax / 3;
    r.setAttribute('x', x(i) - (W / n) * 0.4); r.setAttribute('width', (W / n) * 0.8);
    r.setAttribute('y', H - pad - h); r.setAttribute('height', h);
    r.setAttribute('fill', 'var(--reqs)');
    parts.push(r);
  });
  for (const [key, max, color] of [['ttft_mean_s', ttftMax, 'var(--ttft)'], ['tpot_mean_s', tpotMax, 'var(--tpot)']]) {
    const points = buckets.map((b, i) => (b[key] === null ? null : [x(i), y(b[key], max)]))
        .filter((p) => p !== null);
    if (points.length === 0) continue;
    const line = document.createElementNS(ns, 'polyline');
    line.setAttribute('points', points.map(([px, py]) => `${px.toFixed(1)},${py.toFixed(1)}`).join(' '));
    line.setAttribute('fill', 'none'); line.setAttribute('stroke', color); line.setAttribute('stroke-width', '2');
    parts.push(line);
    for (const [px, py] of points) {  // a bucket alone has no line: its dot shows it
      const dot = document.createElementNS(ns, 'circle');
      dot.setAttribute('cx', px); dot.setAttribute('cy', py); dot.setAttribute('r', '3');
      dot.setAttribute('fill', color);
      parts.push(dot);
    }
  }
  svg.replaceChildren(...parts);
  const m = state.latency.last_minute;
  $('latency-note').textContent = `scale: TTFT up to ${ms(ttftMax)}, TPOT up to ${ms(tpotMax)} · last minute: ` +
      `${m.requests} requests, TTFT p90 ${ms(m.ttft_p90_s)}, TPOT p90 ${ms(m.tpot_p90_s)}, ` +
      `end-to-end p50 ${ms(m.e2e_p50_s)}`;
}

function setStatus(cls, text) {
  const s = $('status');
  s.className = 'status ' + cls;
  s.textContent = text;
}

async function update() {
  try {
    const res = await fetch('/ui/state', { cache: 'no-store' });
    if (!res.ok) throw new Error('HTTP ' + res.status);
    const state = await res.json();
    const now = performance.now();
    $('model').textContent = state.model;
    $('plan').textContent = state.plan || 'one rank';
    $('uptime').textContent = 'up ' + duration(state.uptime_s);
    drawCards(state, now);
    drawRanks(state);
    drawLedger(state);
    drawLatency(state);
    setStatus(state.scheduler.recovering ? 'stale' : 'live',
              state.scheduler.recovering ? 'restarting ranks' : 'live');
    ui.updates.push(now);
    if (ui.updates.length > 600) ui.updates.shift();
  } catch (e) {
    ++ui.failures;
    setStatus('down', 'unreachable: ' + e.message);
  }
  setTimeout(update, UPDATE_MS);
}

// The prompt box: one streamed completion at a time.
let controller = null;

async function send(event) {
  event.preventDefault();
  if (controller) return;
  const out = $('output');
  out.replaceChildren();
  ui.chunks = 0;
  ui.streamDone = false;
  const headers = { 'Content-Type': 'application/json' };
  const key = $('api-key').value;
  if (key) headers.Authorization = 'Bearer ' + key;
  const body = {
    prompt: $('prompt').value,
    max_tokens: Number($('max-tokens').value) || 16,
    temperature: Number($('temperature').value),
    stream: true,
    stream_options: { include_usage: true },
  };
  controller = new AbortController();
  $('send').disabled = true;
  $('stop').disabled = false;
  const start = performance.now();
  let first = null, usage = null;
  const fail = (message) => out.append(el('span', { class: 'error' }, '\n[' + message + ']'));
  try {
    const res = await fetch('/v1/completions', {
      method: 'POST', headers, body: JSON.stringify(body), signal: controller.signal,
    });
    if (!res.ok) {
      const text = await res.text();
      let message = 'HTTP ' + res.status;
      try { message += ': ' + JSON.parse(text).error.message; } catch (_) { /* not JSON */ }
      fail(message);
      return;
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith('data: ')) continue;
        const data = event.slice(6);
        if (data === '[DONE]') { ui.streamDone = true; continue; }
        const chunk = JSON.parse(data);
        if (chunk.error) { fail(chunk.error.message); continue; }
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          if (!choice.text) continue;
          if (first === null) first = performance.now();
          out.append(choice.text);
          ++ui.chunks;
        }
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError') fail(e.message);
  } finally {
    controller = null;
    $('send').disabled = false;
    $('stop').disabled = true;
    const total = performance.now() - start;
    $('output-stats').textContent = (first === null ? 'no tokens' : `first token after ${(first - start).toFixed(0)} ms`) +
        ` · ${(total / 1000).toFixed(2)} s` + (usage ? ` · ${usage.completion_tokens} tokens` : '');
  }
}

$('prompt-form').addEventListener('submit', send);
$('stop').addEventListener('click', () => controller && controller.abort());
update();
