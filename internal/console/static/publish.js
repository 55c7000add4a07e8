// The publish form: built from the event type's JSON Schema, checked in the
// page with the schema's rules (the ones the ingress applies), secrets
// sealed here with age to the recipient the operator gives. A secret's
// plaintext lives only in an input that has no name and is never read into
// anything that is sent: only its ciphertext is. Plain JavaScript, no build
// step; age.js is the vendored age-encryption bundle.

import { Encrypter, armor } from "./vendor/age.js";

const form = document.getElementById("publish");
const schema = JSON.parse(form.dataset.schema);
const sealed = form.dataset.sealed === "true";
const csrf = document.querySelector("meta[name=csrf-token]").content;
const problemsEl = document.getElementById("problems");
const statusEl = document.getElementById("publish-status");

// The largest plaintext the workers open (internal/agekey.MaxPlaintext).
const maxPlaintext = 64 << 10;

// build returns a node for the schema at path: {el, collect}. collect(ctx)
// returns the value the operator entered (undefined when left empty), and
// seals secrets through ctx.
function build(sch, path, name) {
  if ("const" in sch) {
    const el = document.createElement("p");
    el.className = "rule";
    el.textContent = `${name}: ${JSON.stringify(sch.const)} (fixed by the schema)`;
    return { el, collect: async () => sch.const };
  }
  switch (sch.type) {
    case "object":
      return buildObject(sch, path, name);
    case "array":
      return buildArray(sch, path, name);
    case "integer":
    case "number":
      return buildInput(sch, path, name, "number");
    default:
      if (sealed && name === "secret") return buildSecret(sch, path, name);
      return buildInput(sch, path, name, "text");
  }
}

function rules(sch) {
  const out = [];
  if (sch.type) out.push(sch.type);
  if (sch.pattern) out.push(`pattern ${sch.pattern}`);
  if (sch.minLength !== undefined) out.push(`at least ${sch.minLength} characters`);
  if (sch.maxLength !== undefined) out.push(`at most ${sch.maxLength} characters`);
  if (sch.minimum !== undefined) out.push(`at least ${sch.minimum}`);
  return out.join(", ");
}

function labelled(name, input, sch, required) {
  const label = document.createElement("label");
  label.append(`${name}${required ? "" : " (optional)"}`);
  label.append(input);
  const rule = document.createElement("span");
  rule.className = "rule";
  rule.textContent = rules(sch);
  label.append(rule);
  return label;
}

function buildInput(sch, path, name, kind) {
  const input = document.createElement("input");
  input.type = kind;
  if (kind === "number") input.step = "1";
  input.dataset.path = path;
  input.id = "field" + path.replaceAll("/", "-");
  input.autocomplete = "off";
  input.spellcheck = false;
  const el = labelled(name, input, sch, true);
  return {
    el,
    input,
    collect: async () => {
      const v = input.value.trim();
      if (v === "") return undefined;
      return kind === "number" ? Number(v) : v;
    },
  };
}

// buildSecret asks for the plaintext in a password input with no name, so
// no form submission could ever carry it, and seals it when collected.
function buildSecret(sch, path, name) {
  const input = document.createElement("input");
  input.type = "password";
  input.autocomplete = "new-password";
  input.dataset.path = path;
  input.dataset.secret = "true";
  input.id = "field" + path.replaceAll("/", "-");
  const label = document.createElement("label");
  label.append(`${name} (plaintext: sealed in this page, never sent)`);
  label.append(input);
  return {
    el: label,
    input,
    collect: async (ctx) => {
      const plain = input.value;
      if (plain === "") {
        ctx.problems.push(`${path}: the plaintext is empty; type the secret to seal`);
        return undefined;
      }
      if (new TextEncoder().encode(plain).length > maxPlaintext) {
        ctx.problems.push(`${path}: the plaintext is over ${maxPlaintext} bytes, which the workers refuse`);
        return undefined;
      }
      return ctx.seal(plain);
    },
  };
}

function buildObject(sch, path, name) {
  const fs = document.createElement("fieldset");
  if (path !== "") {
    const legend = document.createElement("legend");
    legend.textContent = name;
    fs.append(legend);
  }
  const children = [];
  const required = new Set(sch.required || []);
  for (const [prop, sub] of Object.entries(sch.properties || {})) {
    if (sealed && path === "" && prop === "envelope") {
      // The controller's signature over what this page sends: the
      // server adds it, after the page has sealed the secrets.
      const note = document.createElement("p");
      note.className = "rule";
      note.textContent = "envelope: signed by the server with the controller key, over the sealed data";
      fs.append(note);
      continue;
    }
    const node = build(sub, `${path}/${prop}`, prop);
    if (!required.has(prop) && node.el.firstChild && node.el.tagName === "LABEL") {
      node.el.firstChild.textContent = `${prop} (optional)`;
    }
    fs.append(node.el);
    children.push([prop, node]);
  }
  return {
    el: fs,
    collect: async (ctx) => {
      const out = {};
      for (const [prop, node] of children) {
        const v = await node.collect(ctx);
        if (v !== undefined) out[prop] = v;
      }
      return out;
    },
  };
}

function buildArray(sch, path, name) {
  const fs = document.createElement("fieldset");
  const legend = document.createElement("legend");
  legend.textContent = `${name} (${sch.minItems || 0} to ${sch.maxItems ?? "any number of"} items)`;
  fs.append(legend);
  const list = document.createElement("div");
  fs.append(list);
  const items = [];
  const add = document.createElement("button");
  add.type = "button";
  add.id = "add" + path.replaceAll("/", "-");
  add.textContent = `Add to ${name}`;
  const renumber = () => {
    // Paths follow the item's place, so a problem names the right one.
    items.forEach((it, i) => (it.legend.textContent = `${name}[${i}]`));
  };
  add.addEventListener("click", () => {
    const i = items.length;
    const node = build(sch.items || {}, `${path}/${i}`, `${name}[${i}]`);
    const wrap = document.createElement("div");
    const legendEl = node.el.querySelector("legend") || document.createElement("span");
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "Remove";
    const item = { node, wrap, legend: legendEl };
    remove.addEventListener("click", () => {
      items.splice(items.indexOf(item), 1);
      wrap.remove();
      renumber();
    });
    wrap.append(node.el, remove);
    list.append(wrap);
    items.push(item);
  });
  fs.append(add);
  for (let i = 0; i < (sch.minItems || 0); i++) add.click();
  return {
    el: fs,
    collect: async (ctx) => {
      const out = [];
      for (const it of items) out.push(await it.node.collect(ctx));
      return out;
    },
  };
}

// validate checks value against sch with the keywords Steward's schemas
// use (2020-12: type, const, required, properties, additionalProperties,
// pattern, minLength, maxLength, minimum, items, minItems, maxItems),
// naming each failing field as a JSON pointer, as the server does, and
// never quoting a value.
function validate(sch, value, path, problems) {
  const where = path || "/";
  if ("const" in sch && JSON.stringify(value) !== JSON.stringify(sch.const)) {
    problems.push(`${where}: must be ${JSON.stringify(sch.const)}`);
    return;
  }
  const type = sch.type;
  if (type === "object") {
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      problems.push(`${where}: want object`);
      return;
    }
    for (const req of sch.required || []) {
      if (!(req in value)) problems.push(`${where}: missing property ${req}`);
    }
    for (const [k, v] of Object.entries(value)) {
      const sub = (sch.properties || {})[k];
      if (sub) validate(sub, v, `${path}/${k}`, problems);
      else if (sch.additionalProperties === false) problems.push(`${where}: additional property ${k} is not allowed`);
    }
    return;
  }
  if (type === "array") {
    if (!Array.isArray(value)) {
      problems.push(`${where}: want array`);
      return;
    }
    if (sch.minItems !== undefined && value.length < sch.minItems) problems.push(`${where}: at least ${sch.minItems} items`);
    if (sch.maxItems !== undefined && value.length > sch.maxItems) problems.push(`${where}: at most ${sch.maxItems} items`);
    value.forEach((v, i) => validate(sch.items || {}, v, `${path}/${i}`, problems));
    return;
  }
  if (type === "integer" || type === "number") {
    if (typeof value !== "number" || Number.isNaN(value) || (type === "integer" && !Number.isInteger(value))) {
      problems.push(`${where}: want ${type}`);
      return;
    }
    if (sch.minimum !== undefined && value < sch.minimum) problems.push(`${where}: must be at least ${sch.minimum}`);
    return;
  }
  if (type === "string") {
    if (typeof value !== "string") {
      problems.push(`${where}: want string`);
      return;
    }
    // Lengths count code points, as JSON Schema does.
    const n = [...value].length;
    if (sch.minLength !== undefined && n < sch.minLength) problems.push(`${where}: at least ${sch.minLength} characters`);
    if (sch.maxLength !== undefined && n > sch.maxLength) problems.push(`${where}: at most ${sch.maxLength} characters`);
    if (sch.pattern && !new RegExp(sch.pattern, "u").test(value)) problems.push(`${where}: does not match pattern ${sch.pattern}`);
  }
}

const root = build(schema, "", "data");
document.getElementById("fields").append(root.el);

function show(problems) {
  problemsEl.replaceChildren(...problems.map((p) => Object.assign(document.createElement("li"), { textContent: p })));
  problemsEl.hidden = problems.length === 0;
}

form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  statusEl.textContent = "";
  const problems = [];
  let recipient = "";
  if (sealed) {
    recipient = document.getElementById("recipient").value.trim();
    if (!window.isSecureContext) {
      problems.push("this page is not a secure context, so it cannot seal: open the console over HTTPS (or on 127.0.0.1)");
    } else if (!/^age1[02-9ac-hj-np-z]+$/.test(recipient)) {
      problems.push("recipient: not an age recipient (age1…, as age-keygen -y or steward keys prints it)");
    }
  }
  if (problems.length) return show(problems);
  const ctx = {
    problems,
    seal: async (plain) => {
      const e = new Encrypter();
      e.addRecipient(recipient);
      return armor.encode(await e.encrypt(plain));
    },
  };
  let data;
  try {
    data = await root.collect(ctx);
  } catch (e) {
    // age's own messages never hold the plaintext; they name the recipient.
    return show([`sealing failed: ${e.message}`]);
  }
  validate(schema, data, "", problems);
  if (problems.length) return show(problems);
  show([]);
  statusEl.textContent = "publishing…";
  const resp = await fetch("/api/publish", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify({ type: form.dataset.type, data }),
  });
  const body = await resp.json().catch(() => ({ error: `the server answered ${resp.status}` }));
  if (!resp.ok) {
    statusEl.textContent = "";
    return show([body.error || `the server answered ${resp.status}`]);
  }
  // The plaintext is not kept a moment longer than needed.
  for (const input of form.querySelectorAll("input[data-secret]")) input.value = "";
  statusEl.textContent = `published ${body.id} at ${body.stream} ${body.sequence}${body.duplicate ? " (a duplicate: already stored)" : ""}`;
  if (body.follow) location.assign(body.follow);
});
