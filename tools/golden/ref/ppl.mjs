#!/usr/bin/env node
// ppl.mjs computes llama.cpp's perplexity of a text the way `commit-run eval ppl` defines it:
// the text tokenized without BOS, cut into consecutive windows of --window tokens, each window
// evaluated from an empty cache in one batch, every token but a window's first scored with a
// float64 log-softmax of llama.cpp's raw logits. It prints one JSON object with the totals and
// each window's scored tokens and negative log-likelihood, so a test can check any prefix.
//
//   node ppl.mjs --model FILE.gguf --text FILE.txt [--window 256] [--threads 2] [--ids FILE.u16]
//
// --ids, when given, is the engine's own tokenization (uint16 little-endian, as tools/tinymoe
// prep writes it); the script fails unless llama.cpp's tokenization is identical, so that both
// perplexities are over the same tokens.
import fs from "node:fs";
import crypto from "node:crypto";
import {parseArgs} from "node:util";
import {loadLlama, cpuVariant, buildInfo} from "./common.mjs";

const {values: args} = parseArgs({
    options: {
        model: {type: "string"},
        text: {type: "string"},
        ids: {type: "string", default: ""},
        window: {type: "string", default: "256"},
        threads: {type: "string", default: "2"},
    },
});
if (!args.model || !args.text) {
    console.error("usage: node ppl.mjs --model FILE.gguf --text FILE.txt [--window N] [--threads N] [--ids FILE.u16]");
    process.exit(2);
}
const window = Number(args.window);
const {llama, logs} = await loadLlama();
const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0});
const text = fs.readFileSync(args.text, "utf8");
const tokens = Array.from(model.tokenize(text, false));
if (args.ids) {
    const b = fs.readFileSync(args.ids);
    const ours = Array.from({length: b.length / 2}, (_, i) => b.readUInt16LE(2 * i));
    const n = Math.min(ours.length, tokens.length);
    let i = 0;
    while (i < n && ours[i] === tokens[i]) i++;
    if (i < n || ours.length !== tokens.length) {
        throw new Error(`tokenizations differ at token ${i}: engine ${ours.length} tokens, llama.cpp ${tokens.length}`);
    }
}
const context = await model.createContext({
    contextSize: window, batchSize: window, sequences: 1, threads: Number(args.threads), flashAttention: false,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const seq = context.getSequence();
let nll = 0, scored = 0;
const windows = [];
for (let start = 0; start + 1 < tokens.length; start += window) {
    const win = tokens.slice(start, start + window);
    await seq.clearHistory();
    const results = await seq.controlledEvaluate(win.map((t, i) => [t, i + 1 < win.length ? {generateNext: {logits: true}} : {}]));
    let wnll = 0;
    for (let i = 0; i + 1 < win.length; i++) {
        const row = results[i]?.next?.logits;
        if (!row) throw new Error(`window at ${start}: no logits at ${i}`);
        let mx = -Infinity;
        for (const v of row.values()) mx = Math.max(mx, v);
        let z = 0;
        for (const v of row.values()) z += Math.exp(v - mx);
        wnll -= row.get(win[i + 1]) - mx - Math.log(z);
    }
    windows.push([win.length - 1, wnll]);
    nll += wnll;
    scored += win.length - 1;
}
const sha256 = file => crypto.createHash("sha256").update(fs.readFileSync(file)).digest("hex");
console.log(JSON.stringify({
    model: args.model, model_sha256: sha256(args.model), text: args.text, text_sha256: sha256(args.text), window, tokens: tokens.length, scored, nll,
    perplexity: Math.exp(nll / scored),
    kv: "f32", windows, generator: {...buildInfo(llama), cpu_variant: cpuVariant()},
}));
await context.dispose();
await model.dispose();
if (logs.length) console.error(logs.join(""));
