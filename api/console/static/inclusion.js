// The console's only script: checks, in the browser, that one audit entry is in the log the
// checkpoint commits to, so the auditor does not take the server's word for it.
//
// 1. leaf = SHA-256(0x00 || the entry's bytes)                          (RFC 9162 2.1.1)
// 2. root = the inclusion proof walked up from the leaf                  (RFC 9162 2.1.3.2)
// 3. the checkpoint (a C2SP signed note) names that tree size and root
// 4. the checkpoint's signature by the key the auditor pinned (Ed25519, C2SP signed-note key id)
//
// Data comes from the page's <script type="application/json" id="inclusion-data"> block (never
// executed: the page's CSP allows scripts from this origin's files only). The pinned key is
// kept in this browser's localStorage; until the auditor pins one, the check says so.
"use strict";

const enc = new TextEncoder();

function hexToBytes(hex) {
  if (!/^([0-9a-f]{2})*$/.test(hex)) throw new Error("not hex: " + hex.slice(0, 16));
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(2 * i, 2), 16);
  return out;
}

function bytesToHex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function b64ToBytes(text) {
  const raw = atob(text);
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

async function sha256(...parts) {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", concat(...parts)));
}

function equal(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

// RFC 9162 2.1.3.2: the root an inclusion proof leads to (BigInt: indexes may pass 2^31).
async function rootFromInclusion(index, size, leaf, proof) {
  if (index < 0n || index >= size) throw new Error(`index ${index} is outside a tree of size ${size}`);
  let fn = index, sn = size - 1n, r = leaf;
  for (const p of proof) {
    if (p.length !== 32) throw new Error("a proof hash has the wrong length");
    if (sn === 0n) throw new Error("the inclusion proof is too long");
    if ((fn & 1n) === 1n || fn === sn) {
      r = await sha256(Uint8Array.of(1), p, r);
      while ((fn & 1n) === 0n && fn !== 0n) { fn >>= 1n; sn >>= 1n; }
    } else {
      r = await sha256(Uint8Array.of(1), r, p);
    }
    fn >>= 1n; sn >>= 1n;
  }
  if (sn !== 0n) throw new Error("the inclusion proof is too short");
  return r;
}

// C2SP signed note: the signed text (up to and with its last newline), its signature lines.
function parseNote(note) {
  const cut = note.indexOf("\n\n");
  if (cut < 0) throw new Error("the checkpoint is not a signed note");
  const text = note.slice(0, cut + 1);
  const lines = text.split("\n");
  const signatures = note.slice(cut + 2).split("\n").filter((l) => l.startsWith("\u2014 ")).map((l) => {
    const [name, sig] = l.slice(2).split(" ");
    return { name, sig: b64ToBytes(sig) };
  });
  return { text, origin: lines[0], size: BigInt(lines[1]), root: b64ToBytes(lines[2]), signatures };
}

// A verifier key <name>+<8 hex key id>+<base64(0x01 || Ed25519 public key)>, its id checked.
async function parseVkey(vkey) {
  const text = vkey.trim(), a = text.indexOf("+"), b = text.indexOf("+", a + 1);  // the key's base64 may hold "+"
  const parts = a < 0 || b < 0 ? [] : [text.slice(0, a), text.slice(a + 1, b), text.slice(b + 1)];
  if (parts.length !== 3 || !/^[0-9a-f]{8}$/.test(parts[1])) throw new Error("a key looks like <name>+<8 hex>+<base64 key>");
  const raw = b64ToBytes(parts[2]);
  if (raw.length !== 33 || raw[0] !== 1) throw new Error("the key is not an Ed25519 (type 0x01) key");
  const id = (await sha256(enc.encode(parts[0]), Uint8Array.of(0x0a), raw)).slice(0, 4);
  if (bytesToHex(id) !== parts[1]) throw new Error("the key's id does not match its name and key");
  return { name: parts[0], id, pub: raw.slice(1) };
}

async function checkSignature(note, vkey) {
  const key = await parseVkey(vkey);
  const line = note.signatures.find((s) => s.name === key.name && equal(s.sig.slice(0, 4), key.id));
  if (!line) return { ok: false, text: `no signature by ${key.name} with the pinned key's id` };
  let pub;
  try {
    pub = await crypto.subtle.importKey("raw", key.pub, { name: "Ed25519" }, false, ["verify"]);
  } catch (e) {
    return { ok: null, text: "this browser's WebCrypto has no Ed25519: the signature is not checked here" };
  }
  const good = await crypto.subtle.verify({ name: "Ed25519" }, pub, line.sig.slice(4), enc.encode(note.text));
  return { ok: good, text: good ? `signed by the pinned key ${key.name}` : "the signature does not verify" };
}

function show(id, ok, text) {
  const el = document.getElementById(id);
  el.textContent = text;
  el.className = ok === true ? "ok" : ok === false ? "error" : "warning";
}

async function check() {
  const data = JSON.parse(document.getElementById("inclusion-data").textContent);
  if (!window.crypto || !crypto.subtle) {
    show("browser-check", null, "not checked: WebCrypto needs a secure context (HTTPS or localhost)");
    return;
  }
  const pinned = localStorage.getItem("fak-console-pinned-key");
  document.getElementById("pin").value = pinned || data.server_key;
  try {
    const leaf = await sha256(Uint8Array.of(0), enc.encode(data.entry));
    if (bytesToHex(leaf) !== data.leaf_hash) throw new Error("the entry's bytes do not hash to its leaf hash");
    const proof = data.proof;
    const root = await rootFromInclusion(BigInt(proof.logIndex), BigInt(proof.treeSize), leaf,
      proof.hashes.map(hexToBytes));
    const note = parseNote(proof.checkpoint);
    if (note.size !== BigInt(proof.treeSize)) throw new Error("the checkpoint is of another tree size");
    if (!equal(note.root, root)) throw new Error("the proof does not lead to the checkpoint's root");
    const sig = pinned ? await checkSignature(note, pinned)
      : { ok: null, text: "no key pinned in this browser: pin the log's key you hold to check the signature" };
    show("browser-check", sig.ok === false ? false : sig.ok,
      `inclusion verified in your browser: entry ${proof.logIndex} is in the tree of size ${proof.treeSize} ` +
      `with root ${bytesToHex(root).slice(0, 16)}…; ${sig.text}`);
  } catch (e) {
    show("browser-check", false, "NOT VERIFIED: " + e.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("pin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    localStorage.setItem("fak-console-pinned-key", document.getElementById("pin").value.trim());
    check();
  });
  check();
});
