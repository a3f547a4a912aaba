// The web console's one script (docs/console.md). It reads everything from the JSON API under
// /api and draws three pages from it: the overview (#/), a queue (#/queue/NAME) and its dead
// letters (#/dead/NAME, one letter at #/letter/NAME/ID).
//
// Safety rules, kept everywhere below: every value from the API goes into the page through
// textContent, createTextNode or setAttribute (never innerHTML); links are built from "#/"
// and encodeURIComponent; the write token lives in this script's memory only (no cookie, no
// storage) and travels as "Authorization: Bearer" on writes. The server's
// Content-Security-Policy forbids inline script, so nothing in a message can run.
'use strict';

const state = { config: null, token: '', timer: null };
const SVG = 'http://www.w3.org/2000/svg';

// el('td', {class: 'num'}, 'text', child...): an element; strings become text nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    e.append(typeof c === 'object' ? c : String(c));
  }
  return e;
}

function link(parts, text, query) {
  let href = '#/' + parts.map(encodeURIComponent).join('/');
  if (query) {
    const q = new URLSearchParams(Object.entries(query).filter(([, v]) => v !== '' && v != null));
    if (q.toString()) href += '?' + q.toString();
  }
  return el('a', { href }, text);
}

function notice(text, isError) {
  const n = document.getElementById('notice');
  n.textContent = text;
  n.className = isError ? 'error' : '';
  n.hidden = !text;
}

async function api(path, body) {
  const init = { headers: {} };
  if (body !== undefined) {
    init.method = 'POST';
    init.headers['Content-Type'] = 'application/json';
    if (state.token) init.headers['Authorization'] = 'Bearer ' + state.token;
    init.body = JSON.stringify(body);
  }
  const res = await fetch('/api/' + path, init);
  const data = await res.json().catch(() => ({ error: 'answer is not JSON' }));
  if (!res.ok) {
    const err = new Error(data.error || res.statusText);
    err.status = res.status;
    err.data = data;
    throw err;
  }
  return data;
}

function fmt(n) {
  if (n === null || n === undefined) return '–';
  if (typeof n !== 'number') return String(n);
  if (!Number.isInteger(n)) return n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2);
  return n.toLocaleString('en-US');
}

// Seconds as people read an age: "42 s", "3.5 min", "2.0 h"; "–" when unknown.
function age(s) {
  if (s === null || s === undefined) return '–';
  if (s < 120) return `${s.toFixed(0)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

// A CSS class for a handler's state ("backing off" -> "state-backing-off").
function stateClass(s) {
  return 'state-' + String(s).replace(/[^a-z]+/g, '-');
}

function last(arr) {
  return arr && arr.length ? arr[arr.length - 1] : null;
}

// A polyline chart of `series` (arrays of numbers of one length) in an inline SVG.
function chart(seriesByName, cls, w, h) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', cls);
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  let max = 0;
  let len = 0;
  for (const s of Object.values(seriesByName)) {
    for (const v of s) max = Math.max(max, v);
    len = Math.max(len, s.length);
  }
  if (len < 2) {
    const t = document.createElementNS(SVG, 'text');
    t.setAttribute('x', 2);
    t.setAttribute('y', h - 6);
    t.setAttribute('font-size', 10);
    t.setAttribute('fill', '#667085');
    t.textContent = 'collecting…';
    svg.append(t);
    return svg;
  }
  for (const [name, s] of Object.entries(seriesByName)) {
    const pts = s.map((v, i) => {
      const x = (i / (len - 1)) * w;
      const y = h - 1 - (max > 0 ? (v / max) * (h - 2) : 0);
      return x.toFixed(1) + ',' + y.toFixed(1);
    });
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('class', 's-' + name);
    line.setAttribute('points', pts.join(' '));
    line.setAttribute('vector-effect', 'non-scaling-stroke');
    svg.append(line);
  }
  const title = document.createElementNS(SVG, 'title');
  title.textContent = 'max ' + fmt(max);
  svg.append(title);
  return svg;
}

function legend(names) {
  return el('div', { class: 'legend' },
    ...names.map((n) => el('span', { class: 'k-' + n }, '— ' + n.replace('_', ' '))));
}

function crumbs(...items) {
  const nav = document.getElementById('crumbs');
  nav.replaceChildren(...items);
}

function show(...nodes) {
  document.getElementById('main').replaceChildren(...nodes);
}

function refreshLater(fn) {
  clearTimeout(state.timer);
  const ms = Math.max(1000, (state.config ? state.config.sample_interval_s : 5) * 1000);
  state.timer = setTimeout(fn, ms);
}

// ---- overview ----------------------------------------------------------------------------

async function overview() {
  crumbs();
  const [data, health] = await Promise.all([api('queues?points=30'), api('health')]);
  const rows = data.queues.map((q) => {
    const h = q.handler;
    const s = q.series || {};
    const rate = (k) => (h ? fmt(last(s[k])) : '–');
    return el('tr', { 'data-queue': q.name },
      el('td', { class: 'cell' }, link(['queue', q.name], q.name)),
      el('td', { class: 'num', 'data-field': 'ready' }, fmt(q.ready)),
      el('td', { class: 'num', 'data-field': 'delayed' }, fmt(q.delayed)),
      el('td', { class: 'num', 'data-field': 'in_flight' }, fmt(q.in_flight)),
      el('td', { class: 'num', 'data-field': 'dead_letters' },
        q.dead_letters === null ? '–' : link(['dead', q.name], fmt(q.dead_letters))),
      el('td', { 'data-field': 'state', class: h ? stateClass(h.state) : 'muted' },
        h ? h.state : 'no handler here'),
      el('td', { class: 'num', 'data-field': 'handled' }, h ? fmt(h.handled) : '–'),
      el('td', { class: 'num', 'data-field': 'failed' }, h ? fmt(h.failed) : '–'),
      el('td', { class: 'num' }, rate('received')),
      el('td', { class: 'num' }, rate('handled')),
      el('td', { class: 'num' }, rate('failed')),
      el('td', { class: 'num' }, rate('dead_lettered')),
      el('td', {}, h ? chart({ handled: s.handled, failed: s.failed }, 'spark', 120, 24) : ''));
  });
  const table = el('table', { id: 'queues' },
    el('thead', {}, el('tr', {},
      ...['queue', 'ready', 'delayed', 'in flight', 'dead letters', 'handler', 'handled',
        'failed', 'recv/s', 'handled/s', 'failed/s', 'dead/s', 'handled / failed']
        .map((t) => el('th', {}, t)))),
    el('tbody', {}, ...rows));
  show(el('h1', {}, `Queues (${data.queues.length})`), table,
    el('h2', {}, 'Health'), healthTable(health));
  refreshLater(route);
}

function healthTable(health) {
  return el('table', { id: 'health' },
    el('thead', {}, el('tr', {}, el('th', {}, 'what'), el('th', {}, 'name'),
      el('th', {}, 'status'))),
    el('tbody', {},
      ...health.checks.map((c) => el('tr', {},
        el('td', {}, c.what), el('td', {}, c.name),
        el('td', { class: c.ok ? 'ok' : 'bad' }, c.ok ? 'ok' : c.error))),
      ...health.handlers.map((h) => el('tr', {},
        el('td', {}, 'handler'), el('td', {}, h.queue),
        el('td', { class: stateClass(h.state) }, h.state)))));
}

// ---- queue -------------------------------------------------------------------------------

async function queuePage(name) {
  crumbs(link([], 'queues'), el('span', {}, name));
  const q = await api('queues/' + encodeURIComponent(name));
  const h = q.handler;
  const stat = (label, v, field) => el('div', { class: 'stat', 'data-field': field },
    el('b', {}, fmt(v)), el('span', { class: 'muted' }, label));
  const stats = el('div', { class: 'stats' },
    stat('ready', q.ready, 'ready'), stat('delayed', q.delayed, 'delayed'),
    stat('in flight', q.in_flight, 'in_flight'),
    stat('oldest ready', age(q.oldest_ready_age_s), 'oldest_ready'),
    el('div', { class: 'stat' }, el('b', {}, link(['dead', name], fmt(q.dead_letters))),
      el('span', { class: 'muted' }, 'dead letters')));
  const nodes = [el('h1', {}, 'Queue ', name), stats];
  if (q.next_due) nodes.push(el('p', { class: 'muted' }, 'next delayed message due ', q.next_due));
  if (h) {
    const s = q.series;
    nodes.push(el('div', { class: 'stats' },
      stat('state', h.state, 'state'), stat('received', h.received, 'received'),
      stat('handled', h.handled, 'handled'), stat('failed', h.failed, 'failed'),
      stat('retried', h.retried), stat('dead-lettered', h.dead_lettered),
      stat('in pipeline', h.in_flight), stat('p99 ms', h.latency_p99_ms)));
    if (state.config.writes) {
      // Pause stops intake (what the handler holds goes back to the broker); Resume restarts it.
      const paused = h.state === 'paused';
      const action = paused ? 'resume' : 'pause';
      nodes.push(el('div', { class: 'actions' }, el('button', { id: action, onclick: () => {
        api('queues/' + encodeURIComponent(name) + '/' + action, {})
          .then((r) => { notice(`${name}: ${r.state}.`, false); route(); })
          .catch((e) => notice(e.message, true));
      } }, paused ? 'Resume' : 'Pause')));
    }
    const span = state.config ? Math.round(state.config.history_s / 60) : 15;
    nodes.push(el('h2', {}, `Last ${span} minutes`), el('div', { class: 'charts' },
      el('div', {}, chart({ received: s.received, handled: s.handled }, 'chart', 560, 120),
        legend(['received', 'handled']), el('p', { class: 'muted' }, 'per second')),
      el('div', {}, chart({ failed: s.failed, dead_lettered: s.dead_lettered }, 'chart', 560, 120),
        legend(['failed', 'dead_lettered']), el('p', { class: 'muted' }, 'per second')),
      el('div', {}, chart({ ready: s.ready, delayed: s.delayed, in_flight: s.in_flight }, 'chart',
        560, 120), legend(['ready', 'delayed', 'in_flight']),
        el('p', { class: 'muted' }, 'messages in the broker'))));
  } else {
    nodes.push(el('p', { class: 'muted' },
      'No handler of this queue runs in this process: counts only, no rates.'));
  }
  show(...nodes);
  refreshLater(route);
}

// ---- dead letters ------------------------------------------------------------------------

const KINDS = ['exhausted', 'permanent', 'malformed', 'poison'];

async function deadPage(name, params) {
  crumbs(link([], 'queues'), link(['queue', name], name), el('span', {}, 'dead letters'));
  const f = {
    kind: params.get('kind') || '', id: params.get('id') || '',
    biz_uid: params.get('biz_uid') || '', reason: params.get('reason') || '',
    page_token: params.get('page_token') || '',
  };
  const q = new URLSearchParams(Object.entries(f).filter(([, v]) => v));
  const data = await api('queues/' + encodeURIComponent(name) + '/dead-letters?' + q);
  const input = (key, label) => el('input', { name: key, placeholder: label, value: f[key] });
  const kindSel = el('select', { name: 'kind' }, el('option', { value: '' }, 'every kind'),
    ...KINDS.map((k) => el('option', { value: k, selected: f.kind === k }, k)));
  const form = el('form', { class: 'search', id: 'search' }, kindSel, input('id', 'id'),
    input('biz_uid', 'biz_uid'), input('reason', 'reason contains'),
    el('button', { type: 'submit' }, 'Search'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const v = Object.fromEntries(new FormData(form).entries());
    location.hash = link(['dead', name], '', v).getAttribute('href');
  });
  const boxes = [];
  const rows = data.letters.map((l) => {
    const box = el('input', { type: 'checkbox', value: l.id, 'aria-label': 'select ' + l.id });
    boxes.push(box);
    return el('tr', { 'data-letter': l.id },
      el('td', {}, state.config.writes ? box : ''),
      el('td', {}, link(['letter', name, l.id], l.id, { after: l.cursor })),
      el('td', {}, l.kind),
      el('td', { class: 'cell' }, l.biz_uid),
      el('td', { class: 'cell reason' }, l.reason),
      el('td', { class: 'num' }, fmt(l.attempts)),
      el('td', { class: 'muted when' }, l.last_failed_at),
      el('td', { class: 'cell preview' }, l.preview));
  });
  const table = el('table', { id: 'letters' },
    el('thead', {}, el('tr', {}, ...['', 'id', 'kind', 'biz_uid', 'reason', 'attempts',
      'last failure', 'payload'].map((t) => el('th', {}, t)))),
    el('tbody', {}, ...rows));
  const paging = el('div', { class: 'actions' },
    el('span', { class: 'muted', id: 'total' }, `${fmt(data.total)} letters of `,
      data.kinds.join(', ')),
    f.page_token ? link(['dead', name], 'first page', { ...f, page_token: '' }) : '',
    data.next_page_token ? link(['dead', name], 'next page', { ...f, page_token: data.next_page_token }) : '');
  const nodes = [el('h1', {}, 'Dead letters of ', name), form, paging, table];
  if (!data.letters.length) nodes.push(el('p', { class: 'muted', id: 'empty' }, 'No letters.'));
  if (state.config.writes) nodes.push(writeActions(name, f, data, boxes));
  show(...nodes);
}

function writeActions(name, f, data, boxes) {
  const kinds = f.kind ? [f.kind] : KINDS;
  const filter = { id: f.id, biz_uid: f.biz_uid, reason: f.reason };
  const hasFilter = Object.values(filter).some((v) => v);
  const box = el('div', { class: 'actions', id: 'write-actions' });
  const confirmBox = el('div', { id: 'confirm' });
  const replaySel = el('button', { id: 'replay-selected', onclick: () => {
    const ids = boxes.filter((b) => b.checked).map((b) => b.value);
    if (!ids.length) return notice('Select letters first.', true);
    write('replay', name, { ids, kinds: KINDS });
  } }, 'Replay selected');
  const replayAll = el('button', { id: 'replay-filter', onclick: () => {
    write('replay', name, { kinds, filter });
  } }, hasFilter ? 'Replay every match' : 'Replay every letter shown by kind');
  const purge = el('button', { class: 'danger', id: 'purge', onclick: () => {
    const n = data.total;
    confirmBox.replaceChildren(el('div', { class: 'confirm' },
      `Delete ${fmt(n)} dead letters of ${kinds.join(', ')} from ${name} for good? `,
      el('button', { class: 'danger', id: 'purge-confirm', onclick: () => {
        write('purge', name, { kinds, count: n });
      } }, `Purge ${fmt(n)} letters`), ' ',
      el('button', { id: 'purge-cancel', onclick: () => confirmBox.replaceChildren() }, 'Cancel')));
  } }, 'Purge…');
  box.append(replaySel, replayAll, hasFilter ? '' : purge);
  return el('div', {}, box, confirmBox);
}

async function write(action, name, body) {
  try {
    const r = await api('queues/' + encodeURIComponent(name) + '/dead-letters/' + action, body);
    notice(action === 'purge' ? `Purged ${fmt(r.purged)} letters.` :
      `Replayed ${fmt(r.replayed)} letters.`, false);
  } catch (e) {
    notice(`${action} failed: ${e.message}`, true);
  }
  route();
}

async function letterPage(name, id, params) {
  crumbs(link([], 'queues'), link(['queue', name], name), link(['dead', name], 'dead letters'),
    el('span', {}, id));
  const after = params.get('after');
  const l = await api('queues/' + encodeURIComponent(name) + '/dead-letters/' +
    encodeURIComponent(id) + (after ? '?after=' + encodeURIComponent(after) : ''));
  const row = (k, v, field) => [el('dt', {}, k), el('dd', { 'data-field': field || k }, v)];
  const dl = el('dl', { class: 'letter' },
    ...row('id', l.id), ...row('message id', l.message_id, 'message_id'),
    ...row('biz_uid', l.biz_uid), ...row('kind', l.kind),
    ...row('reason', l.reason), ...row('attempts', fmt(l.attempts)),
    ...row('replays', fmt(l.replays)), ...row('first failure', l.first_failed_at),
    ...row('last failure', l.last_failed_at), ...row('stored', l.stored_at),
    ...row('trace id', l.trace_id || '–', 'trace_id'),
    ...row('created', l.created_at || '–'), ...row('route key', l.route_key || '–'),
    ...row('payload', fmt(l.payload.bytes) + ' bytes'));
  const headers = el('table', { id: 'headers' },
    el('tbody', {}, ...l.headers.map(([k, v]) => el('tr', {}, el('td', {}, k),
      el('td', { class: 'cell' }, v)))));
  const pre = el('pre', { id: 'payload' });
  const views = {
    text: () => l.payload.text !== null ? l.payload.text : '(not valid UTF-8: see hex)',
    json: () => l.payload.json !== null ? l.payload.json : '(not JSON)',
    hex: () => l.payload.hex.replace(/(.{2})/g, '$1 ').replace(/((?:.. ){32})/g, '$1\n') +
      (l.payload.hex_truncated ? '\n… (first 64 KiB)' : ''),
  };
  const tabs = el('div', { class: 'tabs actions' });
  const pick = (v) => {
    pre.textContent = views[v]();
    for (const b of tabs.children) b.setAttribute('aria-pressed', String(b.value === v));
  };
  for (const v of Object.keys(views)) {
    tabs.append(el('button', { value: v, id: 'view-' + v, onclick: () => pick(v) }, v));
  }
  pick(l.payload.json !== null ? 'json' : l.payload.text !== null ? 'text' : 'hex');
  const nodes = [el('h1', {}, 'Dead letter ', l.id), dl];
  if (state.config.writes) {
    nodes.push(el('div', { class: 'actions' }, el('button', { id: 'replay-one', onclick: () => {
      write('replay', name, { ids: [l.id], kinds: KINDS }).then(() => {});
    } }, 'Replay this letter')));
  }
  nodes.push(el('h2', {}, 'Headers'), headers, el('h2', {}, 'Payload'), tabs, pre);
  show(...nodes);
}

// ---- routing -----------------------------------------------------------------------------

async function route() {
  clearTimeout(state.timer);
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, query] = hash.split('?');
  const parts = path.split('/').filter((p) => p).map(decodeURIComponent);
  const params = new URLSearchParams(query || '');
  try {
    if (!state.config) state.config = await api('config');
    renderMode();
    if (parts[0] === 'queue' && parts.length === 2) await queuePage(parts[1]);
    else if (parts[0] === 'dead' && parts.length === 2) await deadPage(parts[1], params);
    else if (parts[0] === 'letter' && parts.length === 3) await letterPage(parts[1], parts[2], params);
    else await overview();
    // A page is drawn: tests wait for this attribute; the mark times the render.
    document.body.setAttribute('data-ready', String(Date.now()));
    performance.mark('console-rendered');
  } catch (e) {
    show(el('p', { class: 'bad', id: 'error' }, 'Error: ', e.message));
    document.body.setAttribute('data-ready', String(Date.now()));
    refreshLater(route);
  }
}

function renderMode() {
  const mode = document.getElementById('mode');
  mode.textContent = state.config.writes ? 'writes enabled' : 'read-only';
  mode.className = 'mode' + (state.config.writes ? ' writes' : '');
  document.getElementById('token-box').hidden = !state.config.writes;
}

document.getElementById('token').addEventListener('input', (ev) => {
  state.token = ev.target.value;
});
window.addEventListener('hashchange', () => {
  notice('');
  route();
});
route();
