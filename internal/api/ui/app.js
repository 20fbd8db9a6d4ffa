// herd's dashboard: one page, no dependencies, served by every node on
// its admin port. It reads the same JSON API as the CLI, with a token
// kept in this tab's sessionStorage (never in a cookie, so no other site
// can make the browser use it).
'use strict';

const $ = (selector) => document.querySelector(selector);
const pages = ['overview', 'nodes', 'vdis', 'events'];
let token = sessionStorage.getItem('herd-token');
let page = new URLSearchParams(location.search).get('page') || 'overview';
if (!pages.includes(page)) page = 'overview';
const samples = []; // {t, read, write}: this node's NBD byte counters

// Automation (and bookmarks an operator makes for themselves) may pass
// the token in the fragment, which browsers never send to the server.
if (location.hash.startsWith('#token=')) {
  token = decodeURIComponent(location.hash.slice('#token='.length));
  sessionStorage.setItem('herd-token', token);
  history.replaceState(null, '', location.pathname + location.search);
}

class AuthError extends Error {}

async function api(path) {
  const response = await fetch(path, { headers: { Authorization: 'Bearer ' + token }, cache: 'no-store' });
  if (response.status === 401 || response.status === 403) throw new AuthError('the token was refused');
  const body = path === '/metrics' ? await response.text() : await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + ' ' + units[i];
}

function cell(text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function table(el, headers, rows) {
  el.replaceChildren();
  const head = document.createElement('tr');
  for (const h of headers) {
    const th = document.createElement('th');
    th.textContent = h;
    head.append(th);
  }
  el.append(head);
  for (const row of rows) {
    const tr = document.createElement('tr');
    for (const c of row) tr.append(typeof c === 'object' ? c : cell(String(c)));
    el.append(tr);
  }
}

function when(t) {
  return t ? new Date(t).toLocaleString() : '-';
}

function showPage(name) {
  page = name;
  for (const p of pages) $('#page-' + p).hidden = p !== name;
  for (const b of document.querySelectorAll('nav button')) b.classList.toggle('active', b.dataset.page === name);
  history.replaceState(null, '', '?page=' + name);
}

function renderHealth(health, info) {
  const badge = $('#health');
  badge.textContent = health.status;
  badge.className = 'badge ' + health.status;
  $('#summary').textContent = `epoch ${info.epoch} · ${info.nodes_alive}/${info.nodes_total} nodes · ${info.vdis} VDIs · ` +
    (info.quorum ? 'quorum' : 'NO QUORUM') + ` · this node ${info.node_id}` + caSummary(info.ca);
  const reasons = $('#reasons');
  reasons.replaceChildren();
  if (health.reasons.length === 0) {
    const li = document.createElement('li');
    li.textContent = 'All well: every node up, every object fully replicated.';
    reasons.append(li);
  }
  for (const r of health.reasons) {
    const li = document.createElement('li');
    li.textContent = `${r.level}: ${r.what}`;
    li.className = r.level === 'ERR' ? 'error' : '';
    reasons.append(li);
  }
}

// caSummary: the cluster CA's fingerprint and age, and any rotation.
function caSummary(ca) {
  if (!ca) return '';
  const days = Math.floor((Date.now() - Date.parse(ca.created)) / 86400000);
  let text = ` · CA ${ca.fingerprint.slice(0, 16)}… (${days} days old)`;
  const r = ca.rotation;
  if (r) {
    text += ` · CA rotation to ${r.fingerprint.slice(0, 16)}… since ${new Date(r.started).toLocaleString()}: ` +
      `${(r.done || []).length} nodes done` + ((r.missing || []).length ? `, ${r.missing.length} getting theirs` : '') +
      ((r.down || []).length ? `, ${r.down.length} down without one` : '') + ' (herd cluster rotate-ca --finish)';
  }
  return text;
}

// renderCapacity: raw, usable (by the VDIs' copies), provisioned, used.
function renderCapacity(c) {
  table($('#capacity'), ['raw', 'used', 'free', 'copies', 'usable', 'provisioned', 'of usable'],
    [[cell(bytes(c.raw_bytes), 'num'), cell(bytes(c.used_bytes), 'num'), cell(bytes(c.free_bytes), 'num'),
      cell(c.copies.toFixed(1), 'num'), cell(bytes(c.usable_bytes), 'num'), cell(bytes(c.provisioned_bytes), 'num'),
      cell(c.overcommit.toFixed(2) + (c.overcommit > c.overcommit_limit ? ' (over ' + c.overcommit_limit.toFixed(2) + ')' : ''), 'num')]]);
  $('#capacity-note').textContent = c.note ? 'Losing a node: ' + c.note : 'Losing a node: the others have room to re-create its share.';
}

function renderRecovery(entries) {
  table($('#recovery'), ['node', 'address', 'epoch', 'state', 'objects left', 'bytes left', 'rate', 'ETA', 'note'],
    entries.map((e) => {
      const s = e.status || {};
      let note = e.error || s.last_error || '';
      if (!note && s.deferred) note = `${s.deferred} objects wait for a maintenance window`;
      if (!note && s.unavailable) note = `${s.unavailable} objects unavailable`;
      if (!note && !s.epoch) note = 'no recovery pass since this node started';
      return [e.node, e.address, s.epoch || '-', s.state ?? '-', cell(String(s.remaining ?? 0), 'num'),
        cell(bytes(s.bytes_remaining || 0), 'num'), s.rate_bytes_per_second ? bytes(s.rate_bytes_per_second) + '/s' : '-',
        s.eta_seconds ? Math.round(s.eta_seconds) + ' s' : '-', note];
    }));
}

// buildText is a node's version as node list shows it: release, commit,
// the feature level its binary supports.
function buildText(b) {
  if (!b) return '-';
  const release = b.version ? b.version + (b.commit ? ` (${b.commit})` : '') : 'old';
  return `${release} level ${b.feature_level}`;
}

function renderNodes(nodes) {
  table($('#nodes'), ['id', 'address', 'zone', 'capacity', 'used', 'free', 'objects', 'bad blocks', 'role', 'version', 'state'],
    nodes.map((n) => {
      const alive = n.state === 'alive';
      let state = n.state;
      if (n.full) state += ', full';
      if (n.draining && alive) state += n.objects ? ', draining' : ', drained: holds nothing';
      if (n.maintenance_until && new Date(n.maintenance_until) > new Date()) state += ', maintenance until ' + when(n.maintenance_until);
      return [n.id, n.address, n.zone || '-', cell(bytes(n.capacity), 'num'), cell(alive ? bytes(n.used_bytes) : '-', 'num'),
        cell(alive ? bytes(n.free_bytes) : '-', 'num'), cell(alive ? String(n.objects) : '-', 'num'),
        cell(alive ? String(n.checksum_errors) : '-', 'num'), n.role, buildText(n.build), cell(state, alive ? '' : 'down')];
    }));
}

function renderVDIs(tree) {
  const children = new Map();
  for (const v of tree) {
    const key = v.parent || 0;
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(v);
  }
  const rows = [];
  const walk = (parent, depth) => {
    for (const v of children.get(parent) || []) {
      const name = (v.snapshot ? `${v.name}@${v.tag}` : v.name) + (v.deleted ? ' (deleted, kept for its clones)' : '');
      const kind = v.snapshot ? 'snapshot' : 'vdi';
      rows.push([cell('\u00a0\u00a0'.repeat(depth) + (depth ? '└ ' : '') + name), kind, cell(bytes(v.size), 'num'),
        cell(bytes(v.allocated_bytes || 0), 'num'), cell(bytes(v.shared_bytes || 0), 'num'), cell(bytes(v.unique_bytes || 0), 'num'),
        v.ec ? `ec ${v.ec}` : v.copies, when(v.snapshot ? v.snapshot_time : v.created), v.unclean ? cell('unclean: repaired at its next open', 'down') : '']);
      walk(v.id, depth + 1);
    }
  };
  walk(0, 0);
  table($('#vdis'), ['name', 'kind', 'size', 'allocated', 'shared', 'unique', 'copies', 'created', 'note'], rows);
}

function renderEvents(events) {
  table($('#events'), ['time', 'kind', 'event'], events.slice(-100).reverse().map((e) => [when(e.time), e.kind, e.text]));
}

// The node's NBD byte counters, summed over VDIs, from its Prometheus
// metrics; the graph shows their rate.
function sampleIO(text) {
  let read = 0, write = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith('herd_nbd_bytes_total{')) continue;
    const value = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (line.includes('op="read"')) read += value;
    else if (line.includes('op="write"')) write += value;
  }
  samples.push({ t: Date.now(), read, write });
  if (samples.length > 91) samples.shift();
}

function drawIO() {
  const canvas = $('#io');
  const g = canvas.getContext('2d');
  g.clearRect(0, 0, canvas.width, canvas.height);
  const rates = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = (samples[i].t - samples[i - 1].t) / 1000;
    rates.push({ read: Math.max(0, (samples[i].read - samples[i - 1].read) / dt), write: Math.max(0, (samples[i].write - samples[i - 1].write) / dt) });
  }
  const top = Math.max(1024, ...rates.map((r) => Math.max(r.read, r.write)));
  const x = (i) => canvas.width - (rates.length - 1 - i) * (canvas.width / 90);
  const y = (v) => canvas.height - 4 - (v / top) * (canvas.height - 20);
  for (const [key, color] of [['read', '#2874a6'], ['write', '#c0392b']]) {
    g.strokeStyle = color;
    g.lineWidth = 2;
    g.beginPath();
    rates.forEach((r, i) => (i ? g.lineTo(x(i), y(r[key])) : g.moveTo(x(i), y(r[key]))));
    g.stroke();
  }
  g.fillStyle = '#6b7780';
  g.fillText('max ' + bytes(top) + '/s', 6, 12);
  const last = rates[rates.length - 1] || { read: 0, write: 0 };
  $('#io-legend').innerHTML = '';
  for (const [key, label] of [['read', 'read'], ['write', 'written']]) {
    const span = document.createElement('span');
    span.className = key;
    span.textContent = `${label}: ${bytes(last[key])}/s`;
    $('#io-legend').append(span);
  }
}

async function refresh() {
  if (!token) return showLogin();
  try {
    const [info, health, nodes, recovery, tree, events, metrics, capacity] = await Promise.all([
      api('/v1/cluster'), api('/v1/cluster/health'), api('/v1/nodes'), api('/v1/recovery'),
      api('/v1/tree'), api('/v1/events'), api('/metrics'), api('/v1/cluster/capacity')]);
    renderHealth(health, info);
    renderCapacity(capacity);
    renderNodes(nodes);
    renderRecovery(recovery);
    renderVDIs(tree);
    renderEvents(events);
    sampleIO(metrics);
    drawIO();
    $('#error').textContent = '';
    $('#updated').textContent = 'updated ' + new Date().toLocaleTimeString();
    document.body.dataset.loaded = 'yes';
  } catch (err) {
    if (err instanceof AuthError) return showLogin(err.message);
    $('#error').textContent = 'This node did not answer: ' + err.message;
  }
}

function showLogin(message) {
  token = null;
  sessionStorage.removeItem('herd-token');
  for (const p of pages) $('#page-' + p).hidden = true;
  $('#login').hidden = false;
  $('#logout').hidden = true;
  $('#login-error').textContent = message || '';
}

$('#login-form').addEventListener('submit', (e) => {
  e.preventDefault();
  token = $('#token').value.trim();
  sessionStorage.setItem('herd-token', token);
  $('#token').value = '';
  start();
});
$('#logout').addEventListener('click', () => showLogin());
for (const b of document.querySelectorAll('nav button')) b.addEventListener('click', () => showPage(b.dataset.page));

function start() {
  if (!token) return showLogin();
  $('#login').hidden = true;
  $('#logout').hidden = false;
  showPage(page);
  refresh();
}

start();
setInterval(refresh, 2000);
