#!/usr/bin/env node
// bench.mjs measures llama.cpp's prompt and decode speed on a GGUF model (CPU build through
// node-llama-cpp) and prints one JSON line, for tools/bench/cpubench (`make bench-cpu`) to set
// beside commit-run's.
//
//   node bench.mjs FILE [--threads N] [--tokens N] [--prompt N | --prompt-ids 1,2,3] [--batch N]
//                       [--ctx N] [--warmup N] [--kv f16|f32] [--flash auto|on|off] [--no-mmap]
//
// The prompt (--prompt-ids, or --prompt random token ids from a fixed seed) is evaluated in
// batches of --batch tokens (one llama_decode each; llama.cpp's n_batch and n_ubatch; default
// the whole prompt in one), keeping the last token's logits only, and the first token is
// sampled from them; then --tokens tokens are decoded greedily one llama_decode at a time,
// end-of-generation tokens included, so every run decodes exactly --tokens tokens (0: the
// prompt alone, decode_tok_s is null). The first --warmup decode steps are not timed. Defaults are llama.cpp's own: F16 KV cache, flash attention auto,
// memory-mapped weights.
import path from "node:path";
import {parseArgs} from "node:util";
import {loadLlama, cpuVariant, buildInfo} from "./common.mjs";

const usage = "usage: node bench.mjs FILE [--threads N] [--tokens N] [--prompt N | --prompt-ids 1,2,3] [--batch N] [--ctx N] [--warmup N] [--kv f16|f32] [--flash auto|on|off] [--no-mmap]";
const {values: args, positionals} = parseArgs({
    allowPositionals: true,
    options: {
        threads: {type: "string", default: "0"},
        tokens: {type: "string", default: "64"},
        prompt: {type: "string", default: "32"},
        "prompt-ids": {type: "string", default: ""},
        batch: {type: "string", default: "0"},
        ctx: {type: "string", default: "0"},
        warmup: {type: "string", default: "2"},
        kv: {type: "string", default: "f16"},
        flash: {type: "string", default: "auto"},
        "no-mmap": {type: "boolean", default: false},
    },
});
if (positionals.length !== 1) {
    console.error(usage);
    process.exit(2);
}
const file = positionals[0];
const count = (name, min) => {
    const v = Number(args[name]);
    if (!Number.isInteger(v) || v < min) throw new Error(`--${name} ${args[name]}: want an integer >= ${min}`);
    return v;
};
const nTokens = count("tokens", 0), nWarmup = count("warmup", 0);
const kv = args.kv.toUpperCase();
if (!["F16", "F32"].includes(kv)) throw new Error(`--kv ${args.kv}: want f16 or f32`);
const flash = {auto: "auto", on: true, off: false}[args.flash];
if (flash === undefined) throw new Error(`--flash ${args.flash}: want auto, on or off`);

const {llama} = await loadLlama();
const threads = count("threads", 0) || llama.cpuMathCores;
// node-llama-cpp caps every context's threads at maxThreads (the math cores by default); an
// explicit --threads is what gets used, so that both engines of a comparison run as many.
if (llama.maxThreads !== 0 && threads > llama.maxThreads) llama.maxThreads = threads;
// --no-mmap reads the weights into memory at load, so that page faults on experts touched for
// the first time do not land in the timed steps.
const model = await llama.loadModel({modelPath: file, gpuLayers: 0, useMmap: !args["no-mmap"]});
const nVocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;

let prompt;
if (args["prompt-ids"] !== "") {
    prompt = args["prompt-ids"].split(",").map((s) => {
        const id = Number(s.trim());
        if (!Number.isInteger(id) || id < 0 || id >= nVocab) throw new Error(`--prompt-ids: ${s} is not a token id below ${nVocab}`);
        return id;
    });
} else {
    // A fixed pseudo-random prompt (xorshift), so runs are comparable.
    let x = 0x9e3779b9;
    prompt = Array.from({length: count("prompt", 1)}, () => {
        x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
        return x % nVocab;
    });
}
const nPrompt = prompt.length;
if (nPrompt === 0) throw new Error("empty prompt: give at least one token");
// node-llama-cpp sets n_ubatch = n_batch = batchSize; decode below splits longer evaluations
// into batchSize-token llama_decode calls, as its JavaScript side does.
const batchSize = count("batch", 0) || nPrompt;
const ctxSize = count("ctx", 0) || nPrompt + nWarmup + nTokens + 8;
const context = await model.createContext({
    contextSize: ctxSize,
    batchSize,
    sequences: 1,
    threads,
    flashAttention: flash,
    experimentalKvCacheKeyType: kv,
    experimentalKvCacheValueType: kv,
});

// The evaluation goes through node-llama-cpp's native context directly (the internal
// _ctx and _bindings of the pinned 3.22.1): one batch per llama_decode, the last prompt token's
// logits only, one greedy sampler for the whole run. Its public controlledEvaluate creates and
// configures a sampler on every call and its evaluate generator runs JavaScript machinery per
// token; with a 151936-token vocabulary that cost 8 and 4 ms per token here, beside 0.5 ms for
// llama.cpp's own greedy sampling, and would have been charged to llama.cpp.
const native = context._ctx;
const sampler = new llama._bindings.AddonSampler(model._model);
sampler.applyConfig({temperature: 0});
let pos = 0;
// decode evaluates tokens at the next positions in batches of batchSize and returns the token
// sampled from the last one's logits.
const decode = async (tokens) => {
    let logitIndex = -1;
    for (let start = 0; start < tokens.length; start += batchSize) {
        const chunk = tokens.slice(start, start + batchSize);
        const last = start + chunk.length === tokens.length;
        native.initBatch(chunk.length);
        const idx = native.addToBatch(0, pos, Uint32Array.from(chunk), Uint32Array.from(last ? [chunk.length - 1] : []));
        await native.decodeBatch();
        pos += chunk.length;
        if (last) logitIndex = idx[0];
    }
    const token = await native.sampleToken(logitIndex, sampler);
    if (typeof token !== "number" || token < 0) throw new Error(`sampling at position ${pos} gave no token (${token})`);
    return token;
};

// generated holds every sampled token, the prompt pass's first, to compare with other engines.
const generated = [];
const t0 = performance.now();
let next = await decode(prompt);
const t1 = performance.now();
generated.push(next);
for (let i = 0; i < nWarmup && i < nTokens; i++) generated.push(next = await decode([next]));
const t2 = performance.now();
for (let i = 0; i < nTokens; i++) generated.push(next = await decode([next]));
const t3 = performance.now();

const promptSeconds = (t1 - t0) / 1000, decodeSeconds = (t3 - t2) / 1000;
const build = buildInfo(llama);
console.log(JSON.stringify({
    engine: "llama.cpp",
    model: path.resolve(file),
    threads: context.currentThreads,
    prompt_tokens: nPrompt,
    decode_tokens: nTokens,
    prompt_seconds: promptSeconds,
    decode_seconds: decodeSeconds,
    prompt_tok_s: nPrompt / promptSeconds,
    decode_tok_s: nTokens > 0 ? nTokens / decodeSeconds : null,
    ms_per_token: nTokens > 0 ? (t3 - t2) / nTokens : null,
    tokens: generated,
    batch_size: context.batchSize,
    context_size: context.contextSize,
    kv_type: kv.toLowerCase(),
    flash_attention: context.flashAttention,
    mmap: !args["no-mmap"],
    llama_cpp: `${build.llama_cpp_release}${build.llama_cpp_commit ? " " + build.llama_cpp_commit.slice(0, 12) : ""}`,
    node_llama_cpp: build.node_llama_cpp,
    cpu_variant: cpuVariant(),
}));
sampler.dispose();
await context.dispose();
await model.dispose();
