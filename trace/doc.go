// Package trace is the on-disk format of routing traces: for every token of a recorded text,
// the experts each MoE layer chose (top-k order) with their mixing weights and, when the
// header asks for them, the router logits of every MoE layer and the router input h(i).
// Two consumers read it: the offloading benchmark replays the recorded expert selections,
// and the Commit Router trainer learns to predict layer i+1's logits from h(i) (DESIGN.md
// §5). Traces can be many gigabytes (100k tokens x 48 layers x 2048-wide inputs), so Writer
// streams tokens to disk in checksummed chunks and Reader streams them back one chunk at a
// time; neither ever holds more than one chunk.
//
// The package sits below engine and knows nothing of it: it defines its own Header and Token
// types, and a recorder converts engine.RouteEvent rows into them.
//
// # Byte layout, format version 1
//
// Integers are little-endian; floats are IEEE 754 binary32 ("f32") or binary16 ("f16");
// CRC is CRC-32C (Castagnoli, the reflected polynomial 0x82F63B78 with initial value and
// final xor 0xFFFFFFFF, as in iSCSI and ext4; crc32c(b"123456789") = 0xE3069283; in Python
// the crc32c or google-crc32c package).
//
//	file     = preamble frame* done          and nothing after done
//	preamble = magic    [8]byte  "CRTRACE\x00"
//	           version  u32      1
//	           n        u32      length of the header JSON, 2 <= n <= 262144
//	           json     [n]byte  the Header as a UTF-8 JSON object (keys below)
//	           crc      u32      CRC-32C of json
//	frame    = tag      [4]byte  "TOKS" or "DONE"
//	           count    u32
//	           length   u32      payload bytes
//	           crc      u32      CRC-32C of the frame's first 12 bytes (tag, count, length)
//	                             followed by the payload bytes
//	           payload  [length]byte
//
// A "TOKS" frame (a chunk) holds count >= 1 token records back to back, so length = count*R
// (R below) and length <= 64 MiB (MaxChunkBytes). Writer puts up to 256 tokens or about
// 1 MiB in a chunk, but readers must accept any count within those bounds.
//
// The "DONE" frame ends the file: count = 0, length = 16, payload = u64 total tokens, u64
// total "TOKS" frames; both must match what precedes it, and the file must end right after.
//
// Header JSON keys (unknown keys are ignored, so fields can be added without a version bump):
//
//	model         string  model name                 arch       string  architecture (GGUF)
//	model_sha256  string  optional, 64 hex digits    layers     int     block count
//	fingerprint   string  optional, 64 hex digits: the model's routing fingerprint
//	moe_layers    [int]   block indices that route, strictly increasing, each < layers
//	experts       int     routed experts per layer, 1..65535
//	used          int     experts chosen per token (top-k), 1..experts
//	embd          int     router input width; >= 1 when inputs are stored
//	inputs        string  "none", "f16" or "f32"     logits     bool    router logits stored
//	source        string  free text (text file, prompt set)
//	created       string  optional RFC 3339 time     synthetic  bool    routing not from a model
//
// A token record has a fixed size R, so a chunk can be read as an array of records. With
// M = len(moe_layers), k = used, E = experts, D = embd:
//
//	seq    u32  sequence index (prompt or text window)
//	pos    u32  position in the sequence
//	id     i32  token id
//	flags  u32  bit 0: decode token (clear: prompt/prefill token); other bits are zero
//	then for each MoE layer j = 0..M-1, in header order (its block index is moe_layers[j]):
//	  experts  [k]u16      chosen experts in top-k order, distinct, each < E
//	  weights  [k]f32      their mixing weights (after the architecture's normalisation)
//	  logits   [E]f32      the router's raw outputs              only if logits
//	  input    [D]f16|f32  the router input h(i)                 only if inputs != "none"
//
//	R = 16 + M*(6k + 4E*[logits] + D*{none: 0, f16: 2, f32: 4})
//
// Every stored float is finite. With numpy a chunk's payload decodes in one call:
//
//	layer = [("experts", "<u2", (k,)), ("weights", "<f4", (k,))]
//	if h["logits"]: layer.append(("logits", "<f4", (E,)))
//	if h["inputs"] != "none": layer.append(("input", "<f2" if h["inputs"] == "f16" else "<f4", (D,)))
//	rec = np.dtype([("seq", "<u4"), ("pos", "<u4"), ("id", "<i4"), ("flags", "<u4"),
//	                ("layers", np.dtype(layer), (M,))])      # rec.itemsize == R
//	tokens = np.frombuffer(payload, dtype=rec, count=count)
//
// # Incomplete and damaged files
//
// A file without its "DONE" frame is incomplete: the recorder died or a copy was cut short.
// Reader still returns every token of every complete chunk, then ErrTruncated (never
// io.EOF), also when the cut falls exactly on a chunk boundary; a consumer that accepts a
// partial trace checks errors.Is(err, ErrTruncated) and keeps what it got. A recorder that
// wants little to be lost calls Writer.Flush at points it cares about (the end of a prompt).
// Checksum mismatches, impossible lengths and out-of-range values are ErrCorrupt (which
// ErrTruncated also matches), with the chunk index and byte offset in the message.
package trace
