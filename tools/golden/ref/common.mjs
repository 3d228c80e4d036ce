// Shared set-up of the reference scripts: pick the llama.cpp CPU build, load it, and describe it.
import fs from "node:fs";
import path from "node:path";
import {execFileSync} from "node:child_process";
import {fileURLToPath} from "node:url";

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
