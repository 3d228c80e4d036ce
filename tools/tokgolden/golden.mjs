// golden.mjs asks llama.cpp (through node-llama-cpp's prebuilt CPU build)
// how it tokenizes texts.json with each vocab-only GGUF listed in the
// manifest that `go run ./tools/tokgolden` wrote, and stores the answers
// as the expected values of package tokenizer's tests.
//
// Usage: node golden.mjs <manifest.json> <out dir>   (see README.md)
import {createHash} from "node:crypto";
import {mkdirSync, readFileSync, writeFileSync} from "node:fs";
import {dirname, join} from "node:path";
import {fileURLToPath} from "node:url";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const here = dirname(fileURLToPath(import.meta.url));
const [manifestPath, outDir] = process.argv.slice(2);
if (!manifestPath || !outDir) {
    console.error("usage: node golden.mjs <manifest.json> <out dir>");
    process.exit(2);
}
const manifest = JSON.parse(readFileSync(manifestPath, "utf8"));
const {texts} = JSON.parse(readFileSync(join(here, "texts.json"), "utf8"));
const pkg = JSON.parse(readFileSync(join(here, "node_modules/node-llama-cpp/package.json"), "utf8"));
const info = JSON.parse(readFileSync(join(here, "node_modules/node-llama-cpp/llama/llama.cpp.info.json"), "utf8"));

// The CPU backend variant llama.cpp picked is only visible in its log.
let cpuBackend = "";
const llama = await getLlama({
    gpu: false,
    logLevel: LlamaLogLevel.info,
    logger(level, message) {
        const m = /loaded CPU backend from (\S+)/.exec(message);
        if (m) cpuBackend = m[1].split("/").pop();
        if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) console.error(message.trimEnd());
    },
});

// ... and on Linux in the process's memory map, which is more reliable.
try {
    const m = /\/(libggml-cpu-[^/\s]+\.so)/.exec(readFileSync("/proc/self/maps", "utf8"));
    if (m) cpuBackend = m[1];
} catch {
    // not Linux: keep what the log said
}

mkdirSync(join(outDir, "golden"), {recursive: true});
const seenVocab = new Set();
for (const entry of manifest) {
    const model = await llama.loadModel({modelPath: entry.gguf, vocabOnly: true});
    const raw = model._model;
    const n = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
    const isSPM = model.fileInfo.metadata.tokenizer.ggml.model === "llama";

    const cases = [];
    for (const text of texts) {
        for (const special of [false, true]) {
            const ids = Array.from(model.tokenize(text, special));
            cases.push({
                text, special, ids,
                detok: model.detokenize(ids, false),
                detok_special: model.detokenize(ids, true),
            });
        }
    }

    const out = {
        vocab: entry.vocab,
        pre: entry.pre,
        gguf: `${entry.vocab}.gguf.gz`,
        llama_cpp: `node-llama-cpp ${pkg.version}, llama.cpp ${info.tag}, ${cpuBackend || "CPU backend not reported"}`,
        cases,
    };

    // Per-vocabulary facts do not depend on the pre-tokenizer: record them
    // once, with the vocabulary's own pre-tokenizer.
    if (!seenVocab.has(entry.vocab)) {
        seenVocab.add(entry.vocab);
        out.bos = model.tokens.bos;
        out.eos = model.tokens.eos;
        out.add_bos = raw.shouldPrependBosToken();
        const eog = [];
        const attrs = {};
        // token_to_piece for every id; llama_detokenize is the only way in,
        // and for SentencePiece it strips the first piece's leading space
        // unless a BOS comes first, so pieces are rendered after a BOS.
        const hash = createHash("sha256");
        const sample = {};
        const bosText = isSPM ? model.detokenize([model.tokens.bos], true) : "";
        for (let id = 0; id < n; id++) {
            if (raw.isEogToken(id)) eog.push(id);
            const a = raw.getTokenAttributes(id);
            if (a !== 4) attrs[id] = a; // 4 = normal
            let piece = isSPM ? model.detokenize([model.tokens.bos, id], true) : model.detokenize([id], true);
            if (isSPM) piece = piece.slice(bosText.length);
            const bytes = Buffer.from(piece, "utf8");
            const len = Buffer.alloc(4);
            len.writeUInt32LE(bytes.length);
            hash.update(len);
            hash.update(bytes);
            if (id < 300 || id % 997 === 0 || a !== 4) sample[id] = piece;
        }
        out.eog = eog;
        out.attrs = attrs;
        out.pieces_sha256 = hash.digest("hex");
        out.pieces_sample = sample;
    }

    const path = join(outDir, "golden", `${entry.vocab}-${entry.pre || "none"}.json`);
    writeFileSync(path, JSON.stringify(out, null, 1) + "\n");
    console.log(`wrote ${path} (${cases.length} cases) with ${out.llama_cpp}`);
    await model.dispose();
}
await llama.dispose();
