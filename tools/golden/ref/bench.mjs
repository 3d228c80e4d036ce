#!/usr/bin/env node
// bench.mjs measures llama.cpp's decode speed on a GGUF model (CPU build through
// node-llama-cpp) and prints one JSON line, for `make bench-cpu` to set beside commit-run's.
//
//   node bench.mjs FILE [--threads N] [--tokens N] [--prompt N] [--warmup N] [--kv f16|f32] [--flash auto|on|off] [--no-mmap]
//
// The prompt (random ordinary token ids, fixed seed) is evaluated in one batch; then tokens are
// decoded greedily one llama_decode at a time, end-of-generation tokens included, so every run
// decodes exactly --tokens tokens. The first --warmup decode steps are not timed (they fault
// the memory-mapped weights in). Defaults are llama.cpp's own: F16 KV cache, flash attention
// auto.
import path from "node:path";
import {parseArgs} from "node:util";
import {loadLlama, cpuVariant, buildInfo} from "./common.mjs";

const {values: args, positionals} = parseArgs({
    allowPositionals: true,
    options: {
        threads: {type: "string", default: "0"},
        tokens: {type: "string", default: "64"},
        prompt: {type: "string", default: "32"},
        warmup: {type: "string", default: "2"},
        kv: {type: "string", default: "f16"},
        flash: {type: "string", default: "auto"},
        "no-mmap": {type: "boolean", default: false},
    },
});
if (positionals.length !== 1) {
    console.error("usage: node bench.mjs FILE [--threads N] [--tokens N] [--prompt N] [--warmup N] [--kv f16|f32] [--flash auto|on|off]");
    process.exit(2);
}
const file = positionals[0];
const nTokens = Number(args.tokens), nPrompt = Number(args.prompt), nWarmup = Number(args.warmup);
const kv = args.kv.toUpperCase();
if (!["F16", "F32"].includes(kv)) throw new Error(`--kv ${args.kv}: want f16 or f32`);
const flash = {auto: "auto", on: true, off: false}[args.flash];
if (flash === undefined) throw new Error(`--flash ${args.flash}: want auto, on or off`);

const {llama} = await loadLlama();
const threads = Number(args.threads) || llama.cpuMathCores;
// --no-mmap reads the weights into memory at load, so that page faults on experts touched for
// the first time do not land in the timed decode steps.
const model = await llama.loadModel({modelPath: file, gpuLayers: 0, useMmap: !args["no-mmap"]});
const ctxSize = nPrompt + nWarmup + nTokens + 8;
const context = await model.createContext({
    contextSize: ctxSize,
    batchSize: Math.max(nPrompt, 1),
    sequences: 1,
    threads,
    flashAttention: flash,
    experimentalKvCacheKeyType: kv,
    experimentalKvCacheValueType: kv,
});
const seq = context.getSequence();

// A fixed pseudo-random prompt (xorshift), so runs are comparable.
let x = 0x9e3779b9;
const nVocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
const prompt = Array.from({length: nPrompt}, () => {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    return x % nVocab;
});

const step = async (tokens) => {
    const res = await seq.controlledEvaluate(tokens.map((t, i) => i === tokens.length - 1
        ? [t, {generateNext: {token: true, options: {temperature: 0}}}]
        : t));
    return res[res.length - 1].next.token;
};

const t0 = performance.now();
let next = await step(prompt);
const t1 = performance.now();
for (let i = 0; i < nWarmup; i++) next = await step([next]);
const t2 = performance.now();
for (let i = 0; i < nTokens; i++) next = await step([next]);
const t3 = performance.now();

const build = buildInfo(llama);
console.log(JSON.stringify({
    engine: "llama.cpp",
    model: path.resolve(file),
    threads,
    prompt_tokens: nPrompt,
    decode_tokens: nTokens,
    prompt_tok_s: nPrompt / ((t1 - t0) / 1000),
    decode_tok_s: nTokens / ((t3 - t2) / 1000),
    ms_per_token: (t3 - t2) / nTokens,
    kv_type: kv.toLowerCase(),
    flash_attention: context.flashAttention,
    mmap: !args["no-mmap"],
    llama_cpp: `${build.llama_cpp_release}${build.llama_cpp_commit ? " " + build.llama_cpp_commit.slice(0, 12) : ""}`,
    node_llama_cpp: build.node_llama_cpp,
    cpu_variant: cpuVariant(),
}));
await context.dispose();
await model.dispose();
