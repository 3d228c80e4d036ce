#!/usr/bin/env node
// long.mjs runs llama.cpp on a long sequence of the golden models that have a sliding window
// (gpt-oss), where commit-run's windowed layers keep a ring of their window and a pass and go
// round it, and writes one fixture per model into engine/testdata/golden-long for the
// engine's TestGoldenLong.
//
//   node long.mjs --manifest DIR/manifest.json --out ../../../engine/testdata/golden-long [--threads 2] [--only a,b]
//
// Per model: a prompt of PROMPT_TOKENS (the golden fixture's first candidate prompt, repeated,
// each repetition's tokens shifted by one more), decoded in one llama_decode with an F32 KV
// cache and flash attention off; the raw logits after every LOGIT_EVERY-th prompt position
// and the last (float32, base64, position-major, at logit_positions); and the greedy
// continuation of GREEDY_TOKENS, one token per llama_decode, with llama.cpp's top-1/top-2
// logit margin at each step.
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import {loadLlama, cpuVariant, buildInfo, manifestArgs, denseLogits, margin, writeFixtures} from "./common.mjs";

// The models with a long fixture: those whose attention has a sliding window.
const LONG = new Set(["gpt-oss-f32"]);
const PROMPT_TOKENS = 900;
const GREEDY_TOKENS = 300;
const LOGIT_EVERY = 64;
const CONTEXT = 2048;

const {out, threads, only, manifestDir, manifest} = manifestArgs("long.mjs");

const {llama, logs} = await loadLlama();
const build = buildInfo(llama);
await writeFixtures(manifest.filter(e => LONG.has(e.name) && (only.size === 0 || only.has(e.name))), out, logs, runModel,
    fx => `${fx.prompt.length} + ${fx.greedy.length} tokens  cpu ${fx.generator.cpu_variant}`);

async function runModel(entry) {
    const modelPath = path.join(manifestDir, entry.file);
    const sha = crypto.createHash("sha256").update(fs.readFileSync(modelPath)).digest("hex");
    if (sha !== entry.sha256) throw new Error(`${modelPath}: sha256 ${sha}, manifest says ${entry.sha256}`);
    const base = entry.prompts[0];
    const model = await llama.loadModel({modelPath, gpuLayers: 0});
    try {
        // The vocabulary's size, which the manifest does not record: the logits of one token.
        const probe = await model.createContext({contextSize: 16, batchSize: 16, sequences: 1, threads});
        const [r] = await probe.getSequence().controlledEvaluate([[base[0], {generateNext: {logits: true}}]]);
        const nVocab = r.next.logits.size;
        await probe.dispose();
        const prompt = [];
        for (let i = 0; prompt.length < PROMPT_TOKENS; i++)
            prompt.push((base[i % base.length] + Math.floor(i / base.length)) % nVocab);
        const context = await model.createContext({
            contextSize: CONTEXT,
            batchSize: CONTEXT,
            sequences: 1,
            threads,
            flashAttention: false,
            experimentalKvCacheKeyType: "F32",
            experimentalKvCacheValueType: "F32",
        });
        try {
            return await evaluate(entry, context, prompt, nVocab);
        } finally {
            await context.dispose();
        }
    } finally {
        await model.dispose();
    }
}

async function evaluate(entry, context, prompt, nVocab) {
    const seq = context.getSequence();
    const last = prompt.length - 1;
    const positions = [];
    for (let p = 0; p < last; p += LOGIT_EVERY) positions.push(p);
    positions.push(last);
    const want = new Set(positions);
    const results = await seq.controlledEvaluate(prompt.map((t, i) => i === last
        ? [t, {generateNext: {logits: true, token: true, options: {temperature: 0}}}]
        : want.has(i) ? [t, {generateNext: {logits: true}}] : t));
    const logits = new Float32Array(positions.length * nVocab);
    positions.forEach((p, k) => logits.set(denseLogits(results[p]?.next?.logits, nVocab, `position ${p}`), k * nVocab));

    const greedy = [];
    const margins = [margin(logits.subarray((positions.length - 1) * nVocab))];
    let next = results[last].next.token;
    for (let step = 0; step < GREEDY_TOKENS; step++) {
        greedy.push(next);
        if (step === GREEDY_TOKENS - 1) break;
        const [r] = await seq.controlledEvaluate([[next, {generateNext: {logits: true, token: true, options: {temperature: 0}}}]]);
        margins.push(margin(denseLogits(r?.next?.logits, nVocab, `greedy step ${step + 1}`)));
        next = r.next.token;
    }
    return {
        format: 1,
        name: entry.name,
        sha256: entry.sha256,
        vocab: nVocab,
        context: CONTEXT,
        prompt,
        logit_positions: positions,
        logits: Buffer.from(logits.buffer).toString("base64"),
        greedy,
        greedy_margins: margins,
        generator: {
            ...build,
            cpu_variant: cpuVariant(),
            threads,
            kv_type_k: kvType(context.kvCacheKeyType),
            kv_type_v: kvType(context.kvCacheValueType),
            flash_attention: context.flashAttention,
            prompt_batch: "whole prompt in one llama_decode",
            greedy: "temperature 0, one token per llama_decode",
            date: new Date().toISOString().slice(0, 10),
        },
    };
}

// kvType names the KV cache's ggml type, which must be F32 (0), as the golden fixtures'.
function kvType(t) {
    if (t !== 0) throw new Error(`the KV cache has ggml type ${t}, not F32`);
    return "f32";
}

