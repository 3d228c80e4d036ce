#!/usr/bin/env node
// golden.mjs runs llama.cpp (through node-llama-cpp's prebuilt CPU build) on every model of a
// manifest written by `synth -golden` and writes one fixture per model for
// engine/golden_test.go.
//
//   node golden.mjs --manifest DIR/manifest.json --out ../../../engine/testdata/golden [--threads 2] [--only a,b]
//
// Per model it records, with an F32 KV cache, flash attention off and the whole prompt in one
// batch: the raw next-token logits after every prompt position (float32, base64, position-major;
// the test turns them into probabilities with a float64 softmax, which agrees with
// node-llama-cpp's own probabilities to ~1e-7), the greedy continuation of 32 tokens (each
// decoded one token at a time, as a chat would) with the top-1/top-2 logit margin of every
// step, and llama.cpp's tokenization of a few texts.
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import {loadLlama, cpuVariant, buildInfo, manifestArgs, denseLogits, margin, writeFixtures} from "./common.mjs";

const GREEDY_TOKENS = 32;
// MIN_MARGIN is the smallest top-1/top-2 logit gap a greedy step may have in a fixture.
const MIN_MARGIN = 0.05;
const TOKENIZE_TEXTS = [
    "the model is fast",
    "Hello, world! The year 2024 had 365 days.\n\nNew line  and   spaces.",
    "café über naïve — 東京 🙂",
    " leading and trailing space ",
    "it's what they'll do; don't re-read   \t tabs\r\n",
];

const {out, threads, only, manifestDir, manifest} = manifestArgs("golden.mjs");

const {llama, logs} = await loadLlama();
const build = buildInfo(llama);
await writeFixtures(manifest.filter(e => only.size === 0 || only.has(e.name)), out, logs, runModel, fx =>
    `min max-prob ${Math.min(...fx.stats.max_prob).toFixed(3)} (uniform ${(1 / fx.vocab).toFixed(4)})` +
    `  min greedy margin ${Math.min(...fx.greedy_margins).toFixed(3)}  cpu ${fx.generator.cpu_variant}`);

async function runModel(entry) {
    const modelPath = path.join(manifestDir, entry.file);
    const sha = crypto.createHash("sha256").update(fs.readFileSync(modelPath)).digest("hex");
    if (sha !== entry.sha256) throw new Error(`${modelPath}: sha256 ${sha}, manifest says ${entry.sha256}`);

    const model = await llama.loadModel({modelPath, gpuLayers: 0});
    try {
        // Take the first candidate prompt whose greedy continuation never comes near a tie:
        // a continuation decided by a 1e-3 logit gap would fail any engine for reasons that
        // have nothing to do with its correctness.
        let best = null;
        for (let i = 0; i < entry.prompts.length; i++) {
            const fx = await withContext(model, context => evaluate(entry, model, context, entry.prompts[i]));
            fx.prompt_candidate = i;
            const m = Math.min(...fx.greedy_margins);
            if (best === null || m > Math.min(...best.greedy_margins)) best = fx;
            if (m >= MIN_MARGIN) break;
        }
        return best;
    } finally {
        await model.dispose();
    }
}

// withContext runs fn on a fresh context: an F32 KV cache, flash attention off, and a batch
// that holds the whole prompt so it goes through llama.cpp in one llama_decode, as the
// engine's prefill does.
async function withContext(model, fn) {
    const ctxSize = 128;
    const context = await model.createContext({
        contextSize: ctxSize,
        batchSize: ctxSize,
        sequences: 1,
        threads,
        flashAttention: false,
        // node-llama-cpp marks these experimental; they set llama.cpp's type_k/type_v. The
        // context's kvCacheKeyType/kvCacheValueType, recorded in the fixture, confirm them.
        experimentalKvCacheKeyType: "F32",
        experimentalKvCacheValueType: "F32",
    });
    try {
        return await fn(context);
    } finally {
        await context.dispose();
    }
}

async function evaluate(entry, model, context, prompt) {
    const seq = context.getSequence();
    const last = prompt.length - 1;
    const results = await seq.controlledEvaluate(prompt.map((t, i) => [t, {
        generateNext: i === last
            ? {logits: true, token: true, options: {temperature: 0}}
            : {logits: true},
    }]));

    let nVocab = 0;
    for (const r of results) nVocab = Math.max(nVocab, r?.next?.logits?.size ?? 0);
    if (nVocab === 0) throw new Error("no logits returned");
    const logits = new Float32Array(prompt.length * nVocab);
    const maxProb = [];
    results.forEach((r, pos) => {
        const row = denseLogits(r?.next?.logits, nVocab, `position ${pos}`);
        logits.set(row, pos * nVocab);
        maxProb.push(Math.max(...softmax(row)));
    });

    // Greedy continuation, one token per llama_decode, as a chat decodes.
    const greedy = [];
    const margins = [];
    let next = results[last].next.token;
    checkGreedy(denseLogits(results[last].next.logits, nVocab, "last prompt position"), next, 0);
    for (let step = 0; step < GREEDY_TOKENS; step++) {
        greedy.push(next);
        if (step === 0) margins.push(margin(logits.subarray(last * nVocab)));
        if (step === GREEDY_TOKENS - 1) break;
        const [r] = await seq.controlledEvaluate([[next, {generateNext: {logits: true, token: true, options: {temperature: 0}}}]]);
        const row = denseLogits(r?.next?.logits, nVocab, `greedy step ${step + 1}`);
        checkGreedy(row, r.next.token, step + 1);
        margins.push(margin(row));
        next = r.next.token;
    }

    const tokenize = TOKENIZE_TEXTS.map(text => ({text, ids: Array.from(model.tokenize(text, false))}));

    return {
        format: 1,
        name: entry.name,
        ...(entry.model ? {model: entry.model} : {}),
        arch: entry.arch,
        types: entry.types,
        sha256: entry.sha256,
        vocab: nVocab,
        prompt,
        // Raw logits, float32 little-endian, [position][token].
        logits: Buffer.from(logits.buffer).toString("base64"),
        greedy,
        greedy_margins: margins,
        tokenize,
        bos: model.tokens.bos ?? -1,
        eos: model.tokens.eos ?? -1,
        stats: {max_prob: maxProb},
        generator: {
            ...build,
            cpu_variant: cpuVariant(),
            threads,
            kv_type_k: ggmlTypeName(context.kvCacheKeyType),
            kv_type_v: ggmlTypeName(context.kvCacheValueType),
            flash_attention: context.flashAttention,
            prompt_batch: "whole prompt in one llama_decode",
            greedy: "temperature 0, one token per llama_decode",
            date: new Date().toISOString().slice(0, 10),
        },
    };
}

function softmax(row) {
    let mx = -Infinity;
    for (const v of row) mx = Math.max(mx, v);
    let z = 0;
    const p = Array.from(row, v => { const e = Math.exp(v - mx); z += e; return e; });
    return p.map(v => v / z);
}

function checkGreedy(row, token, step) {
    let best = 0;
    for (let i = 1; i < row.length; i++) if (row[i] > row[best]) best = i;
    if (row[token] !== row[best]) throw new Error(`greedy step ${step}: llama.cpp chose ${token}, argmax is ${best}`);
}

function ggmlTypeName(t) {
    const names = {0: "f32", 1: "f16", 8: "q8_0", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 30: "bf16"};
    return names[t] ?? String(t);
}
