// The npm side of bench/bpe.sh: one encoder on the files, each file one
// document after the end-of-text token 50256, in this process.
//   node bpe.js tiktoken|gpt-3-encoder NPM_DIR FILE...
//   node bpe.js shard SHARD
// Prints one JSON line: seconds to load the encoder, seconds in encode
// calls, bytes, tokens, and an FNV-1a hash of the token stream (the same as
// `shard` prints for fourfold's shard, so the streams can be compared).
'use strict';
const fs = require('fs');
const path = require('path');

function fnv(tokens, h) {
    for (const t of tokens) {
        h = Math.imul(h ^ (t & 0xff), 16777619) >>> 0;
        h = Math.imul(h ^ (t >>> 8), 16777619) >>> 0;
    }
    return h;
}

// gpt-3-encoder's encode() concatenates arrays word by word (time quadratic
// in a call's length), so it gets a document in the pieces tests/bpe_npm.js
// cuts (after a '\n' between two characters that are not white space),
// which give the same words
function pieces(text) {
    const out = [];
    let start = 0;
    const ws = /\s/u;
    for (let i = text.indexOf('\n'); i >= 0; i = text.indexOf('\n', i + 1))
        if (i > 0 && i + 1 < text.length && !ws.test(text[i - 1]) && !ws.test(text[i + 1])) {
            out.push(text.slice(start, i + 1));
            start = i + 1;
        }
    out.push(text.slice(start));
    return out;
}

const [mode, dir, ...files] = process.argv.slice(2);
if (mode === 'shard') {
    const b = fs.readFileSync(dir);
    const n = b.readInt32LE(8);
    const t = new Uint16Array(b.buffer.slice(b.byteOffset + 1024, b.byteOffset + 1024 + 2 * n));
    console.log(JSON.stringify({tokens: n, hash: fnv(t, 2166136261)}));
    process.exit(0);
}
const texts = files.map((f) => fs.readFileSync(f, 'utf8'));
const bytes = files.reduce((s, f) => s + fs.statSync(f).size, 0);
let t0 = process.hrtime.bigint();
let encode;
if (mode === 'tiktoken') {
    const {get_encoding} = require(path.join(dir, 'node_modules', 'tiktoken'));
    const enc = get_encoding('gpt2');
    encode = (text) => enc.encode_ordinary(text);
} else if (mode === 'gpt-3-encoder') {
    const enc = require(path.join(dir, 'node_modules', 'gpt-3-encoder'));
    encode = (text) => {
        const out = [];
        for (const p of pieces(text))
            for (const t of enc.encode(p))
                out.push(t);
        return out;
    };
} else {
    console.error('usage: node bpe.js tiktoken|gpt-3-encoder NPM_DIR FILE... | shard SHARD');
    process.exit(2);
}
const load = Number(process.hrtime.bigint() - t0) / 1e9;
let tokens = 0, h = 2166136261, secs = 0;
for (const text of texts) {
    t0 = process.hrtime.bigint();
    const t = encode(text);
    secs += Number(process.hrtime.bigint() - t0) / 1e9;
    h = fnv([50256], h);
    h = fnv(t, h);
    tokens += 1 + t.length;
}
console.log(JSON.stringify({load_s: load, encode_s: secs, bytes, tokens, hash: h}));
