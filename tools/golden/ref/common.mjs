// Shared set-up of the reference scripts: pick the llama.cpp CPU build, load it, and describe it.
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import {execFileSync} from "node:child_process";
import {fileURLToPath} from "node:url";
import {parseArgs} from "node:util";

const here = path.dirname(fileURLToPath(import.meta.url));
export const binDir = path.join(here, "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64");

// On Sapphire Rapids Xeons ggml picks its AMX build (libggml-cpu-sapphirerapids.so), which
// crashed or returned NaN on DeepSeek-V2 here. Moving it aside makes ggml fall back to the best
// remaining variant (zen4 = AVX-512 with BF16/VNNI on such a CPU); the variant that actually
// loaded is read from /proc/self/maps and recorded in every fixture.
export function disableAMX() {
    const amx = path.join(binDir, "libggml-cpu-sapphirerapids.so");
    if (fs.existsSync(amx)) {
        fs.renameSync(amx, amx + ".disabled");
        console.error(`moved ${path.basename(amx)} aside`);
    }
}

// loadLlama returns a CPU-only llama.cpp; it never builds from source, so a missing prebuilt
// binary is an error rather than a long compile.
export async function loadLlama() {
    disableAMX();
    const {getLlama, LlamaLogLevel} = await import("node-llama-cpp");
    const logs = [];
    const llama = await getLlama({
        gpu: false,
        build: "never",
        logLevel: LlamaLogLevel.warn,
        logger: (level, message) => logs.push(`[${level}] ${message}`),
    });
    return {llama, logs};
}

// cpuVariant names the ggml CPU backend library mapped into this process ("zen4", "haswell",
// ...), which is only known once a model has been loaded.
export function cpuVariant() {
    const maps = fs.readFileSync("/proc/self/maps", "utf8");
    const names = new Set();
    for (const m of maps.matchAll(/libggml-cpu-([a-z0-9_]+)\.so/g)) names.add(m[1]);
    return [...names].join(",") || "unknown";
}

// buildInfo describes the llama.cpp build for the fixtures: the release node-llama-cpp ships,
// the commit of its bundled source when git can read it, and the node-llama-cpp version.
export function buildInfo(llama) {
    const pkg = JSON.parse(fs.readFileSync(path.join(here, "node_modules/node-llama-cpp/package.json"), "utf8"));
    let commit = "";
    try {
        const bundle = path.join(here, "node_modules/node-llama-cpp/llama/gitRelease.bundle");
        commit = execFileSync("git", ["bundle", "list-heads", bundle], {encoding: "utf8"}).trim().split(/\s+/)[0];
    } catch {
        // git missing or no bundle: the release tag alone still identifies the build.
    }
    return {
        node_llama_cpp: pkg.version,
        llama_cpp_repo: llama.llamaCppRelease.repo,
        llama_cpp_release: llama.llamaCppRelease.release,
        llama_cpp_commit: commit,
        build_type: llama.buildType,
        system_info: llama.systemInfo,
    };
}

// manifestArgs reads the fixture writers' command line (--manifest DIR/manifest.json --out
// FIXTURE_DIR [--threads N] [--only a,b]), exits with the usage line when it is incomplete,
// and creates the output folder.
export function manifestArgs(script) {
    const {values: args} = parseArgs({
        options: {
            manifest: {type: "string"},
            out: {type: "string"},
            threads: {type: "string", default: "2"},
            only: {type: "string", default: ""},
        },
    });
    if (!args.manifest || !args.out) {
        console.error(`usage: node ${script} --manifest DIR/manifest.json --out FIXTURE_DIR [--threads N] [--only a,b]`);
        process.exit(2);
    }
    fs.mkdirSync(args.out, {recursive: true});
    return {
        out: args.out,
        threads: Number(args.threads),
        only: new Set(args.only.split(",").filter(Boolean)),
        manifestDir: path.dirname(args.manifest),
        manifest: JSON.parse(fs.readFileSync(args.manifest, "utf8")),
    };
}

// denseLogits turns node-llama-cpp's logits map into a row of n, refusing a missing or
// non-finite one.
export function denseLogits(map, n, where) {
    if (!map || map.size !== n) throw new Error(`${where}: expected ${n} logits, got ${map?.size}`);
    const row = new Float32Array(n);
    for (const [t, v] of map) {
        if (!Number.isFinite(v)) throw new Error(`${where}: logit of token ${t} is ${v}`);
        row[t] = v;
    }
    return row;
}

// margin is the gap between the two largest logits: how far the greedy choice is from a tie.
export function margin(row) {
    let a = -Infinity, b = -Infinity;
    for (const v of row) {
        if (v > a) { b = a; a = v; } else if (v > b) b = v;
    }
    return a - b;
}

// writeFixtures runs run on each manifest entry and writes its fixture to out/NAME.json.gz,
// printing a line per fixture (its size, then describe's account of it) or why it failed, with
// llama.cpp's log; the process exits 1 if any failed, else 0.
export async function writeFixtures(entries, out, logs, run, describe) {
    let failures = 0;
    for (const entry of entries) {
        try {
            const fx = await run(entry);
            const file = path.join(out, `${entry.name}.json.gz`);
            fs.writeFileSync(file, zlib.gzipSync(JSON.stringify(fx), {level: 9}));
            console.log(`${entry.name.padEnd(24)} ${(fs.statSync(file).size / 1024).toFixed(1).padStart(6)} KiB  ${describe(fx)}`);
        } catch (err) {
            failures++;
            console.error(`${entry.name}: ${err.stack ?? err}`);
            if (logs.length) console.error(logs.splice(0).join(""));
        }
    }
    process.exit(failures ? 1 : 0);
}
