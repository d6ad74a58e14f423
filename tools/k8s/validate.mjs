#!/usr/bin/env node
// Validates Kubernetes manifests (e.g. the output of `helm template`) against the API schemas
// of the kubernetes-models packages.
//
//   helm template vlake charts/vlake | node tools/k8s/validate.mjs [--expect Kind[=count] ...]
//   node tools/k8s/validate.mjs manifests.yaml ...
//
// Every YAML document (empty ones skipped) must be an object with apiVersion, kind and
// metadata.name; it is constructed with the model class of its apiVersion/kind and checked with
// validate() (types, required fields, unknown fields where the schema forbids them, formats).
// A kind without a model is an error, as is the same kind/namespace/name twice. --expect
// Kind=N requires exactly N objects of that kind (Kind alone: at least one; Kind=0: none).
// Prints one line per object and a summary; exit 0 when everything is valid, 1 otherwise,
// 2 for a bad command line or unreadable input.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const YAML = require("yaml");

// apiVersion -> package (module path prefix) holding its models. Only what the chart uses
// and its neighbours: anything else is an unknown kind.
const GROUPS = {
  "v1": "kubernetes-models/v1",
  "apps/v1": "kubernetes-models/apps/v1",
  "batch/v1": "kubernetes-models/batch/v1",
  "policy/v1": "kubernetes-models/policy/v1",
  "rbac.authorization.k8s.io/v1": "kubernetes-models/rbac.authorization.k8s.io/v1",
  "scheduling.k8s.io/v1": "kubernetes-models/scheduling.k8s.io/v1",
  "node.k8s.io/v1": "kubernetes-models/node.k8s.io/v1",
  "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
};
const NAMESPACED_NOT = new Set(["Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "RuntimeClass"]);

async function modelFor(apiVersion, kind) {
  const prefix = GROUPS[apiVersion];
  if (!prefix || !/^[A-Z][A-Za-z0-9]*$/.test(kind)) return null;
  try {
    const mod = await import(`${prefix}/${kind}`);
    return mod[kind] ?? null;
  } catch (e) {
    if (e && ["ERR_MODULE_NOT_FOUND", "MODULE_NOT_FOUND", "ERR_PACKAGE_PATH_NOT_EXPORTED"].includes(e.code)) return null;
    throw e;
  }
}

function usage(msg) {
  console.error(`validate.mjs: ${msg}\nusage: validate.mjs [--expect Kind[=N]]... [FILE...] (stdin when no FILE)`);
  process.exit(2);
}

function parseArgs(argv) {
  const files = [];
  const expect = new Map();
  for (let k = 0; k < argv.length; k++) {
    const a = argv[k];
    if (a === "--expect") {
      const v = argv[++k];
      const m = v && /^([A-Za-z]+)(?:=(\d+))?$/.exec(v);
      if (!m) usage(`bad --expect ${v}`);
      expect.set(m[1], m[2] === undefined ? -1 : Number(m[2]));
    } else if (a.startsWith("-") && a !== "-") {
      usage(`unknown option ${a}`);
    } else {
      files.push(a);
    }
  }
  return { files, expect };
}

function formatError(e) {
  if (e && Array.isArray(e.errors)) {
    return e.errors.map((x) => `${x.instancePath || x.dataPath || "/"} ${x.message}` +
      (x.params && x.params.additionalProperty ? ` (${x.params.additionalProperty})` : "")).join("; ");
  }
  return String(e && e.message ? e.message : e);
}

async function validateText(text, source, out = console) {
  const errors = [];
  const objects = [];
  const docs = YAML.parseAllDocuments(text);
  for (const [n, doc] of docs.entries()) {
    const where = `${source} document ${n + 1}`;
    if (doc.errors.length) {
      errors.push(`${where}: YAML: ${doc.errors.map((e) => e.message).join("; ")}`);
      continue;
    }
    const obj = doc.toJS();
    if (obj === null || obj === undefined) continue;
    if (typeof obj !== "object" || Array.isArray(obj)) {
      errors.push(`${where}: not an object`);
      continue;
    }
    const { apiVersion, kind } = obj;
    const name = obj.metadata && obj.metadata.name;
    const label = `${kind}/${name} (${apiVersion})`;
    if (typeof apiVersion !== "string" || typeof kind !== "string") {
      errors.push(`${where}: no apiVersion/kind`);
      continue;
    }
    if (typeof name !== "string" || !name) {
      errors.push(`${where}: ${kind} without metadata.name`);
      continue;
    }
    const Model = await modelFor(apiVersion, kind);
    if (!Model) {
      errors.push(`${where}: unknown kind ${kind} in ${apiVersion} (no model to validate it)`);
      continue;
    }
    try {
      new Model(obj).validate();
    } catch (e) {
      errors.push(`${where}: ${label}: ${formatError(e)}`);
      continue;
    }
    if (NAMESPACED_NOT.has(kind) && obj.metadata.namespace) {
      errors.push(`${where}: ${label}: cluster-scoped kind with a namespace`);
      continue;
    }
    objects.push({ kind, name, namespace: obj.metadata.namespace ?? "" });
    out.log(`ok   ${label}`);
  }
  return { errors, objects };
}

async function main() {
  const { files, expect } = parseArgs(process.argv.slice(2));
  const inputs = [];
  try {
    if (!files.length || (files.length === 1 && files[0] === "-")) {
      inputs.push(["stdin", readFileSync(0, "utf8")]);
    } else {
      for (const f of files) inputs.push([f, readFileSync(f, "utf8")]);
    }
  } catch (e) {
    console.error(`validate.mjs: ${e.message}`);
    process.exit(2);
  }
  const errors = [];
  const objects = [];
  for (const [source, text] of inputs) {
    const r = await validateText(text, source);
    errors.push(...r.errors);
    objects.push(...r.objects);
  }
  const seen = new Set();
  for (const o of objects) {
    const key = `${o.kind}/${o.namespace}/${o.name}`;
    if (seen.has(key)) errors.push(`duplicate object ${o.kind} ${o.namespace ? o.namespace + "/" : ""}${o.name}`);
    seen.add(key);
  }
  const counts = new Map();
  for (const o of objects) counts.set(o.kind, (counts.get(o.kind) ?? 0) + 1);
  for (const [kind, want] of expect) {
    const got = counts.get(kind) ?? 0;
    if (want === -1 ? got === 0 : got !== want) {
      errors.push(`expected ${want === -1 ? "at least one" : want} ${kind}, got ${got}`);
    }
  }
  if (!objects.length && !errors.length) errors.push("no objects in the input");
  for (const e of errors) console.log(`FAIL ${e}`);
  console.log(`${objects.length} objects valid, ${errors.length} errors`);
  process.exit(errors.length ? 1 : 0);
}

await main();
