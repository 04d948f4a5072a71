// Package seq is the lightweight profile: Encode turns each operator into an
// integer token through a vocabulary that is stable across iterations, and
// Detect compares each iteration's encoded sequence with the previous one to
// decide whether the swap policy still applies (the WARMUP -> GEN_POLICY ->
// STABLE stage machine).
//
// Everything here is pure and allocation-free per operator: it runs on the
// training host's hot path, once per op.
package seq

import (
	"math"
	"unsafe"
)

// Token is an operator (name + overload) as a small integer.
type Token uint32

type opKey struct{ name, overload string }

// Vocab maps operator names to tokens in order of first appearance, so the
// same op gets the same token in every iteration. It is not safe for
// concurrent use: one training loop drives it.
type Vocab struct {
	ids   map[opKey]Token
	names []opKey
	// stable is each token's hash of its name and overload: sequence hashes
	// fold it instead of the token, so they do not depend on the order in
	// which a process first met its ops (a saved policy cache stays valid).
	stable []uint64
	cache  [cacheSlots]cacheEntry
}

// A host passes the same string values for an op every iteration (literals
// or interned names), so a direct-mapped cache keyed by the strings' data
// pointers answers most lookups without hashing their bytes. Equal pointer
// and length imply equal contents: Go strings are immutable.
const cacheSlots = 512

type cacheEntry struct {
	name, overload *byte
	nlen, olen     int
	tok            Token
	ok             bool
}

// NewVocab returns an empty vocabulary.
func NewVocab() *Vocab { return &Vocab{ids: make(map[opKey]Token)} }

// Token returns the token of an op, adding it on first sight. A lookup of a
// known op does not allocate (a struct of strings is hashed in place).
func (v *Vocab) Token(name, overload string) Token {
	np, op := unsafe.StringData(name), unsafe.StringData(overload)
	slot := &v.cache[(uintptr(unsafe.Pointer(np))>>3^uintptr(unsafe.Pointer(op))>>5^uintptr(len(name)))%cacheSlots]
	if slot.ok && slot.name == np && slot.overload == op && slot.nlen == len(name) && slot.olen == len(overload) {
		return slot.tok
	}
	k := opKey{name, overload}
	t, ok := v.ids[k]
	if !ok {
		t = Token(len(v.names))
		v.ids[k] = t
		v.names = append(v.names, k)
		v.stable = append(v.stable, nameHash(name, overload))
	}
	*slot = cacheEntry{name: np, overload: op, nlen: len(name), olen: len(overload), tok: t, ok: true}
	return t
}

// Name returns the op name and overload of a token.
func (v *Vocab) Name(t Token) (name, overload string) {
	if int(t) >= len(v.names) {
		return "", ""
	}
	k := v.names[t]
	return k.name, k.overload
}

func nameHash(name, overload string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * fnvPrime
	}
	h = (h ^ '.') * fnvPrime
	for i := 0; i < len(overload); i++ {
		h = (h ^ uint64(overload[i])) * fnvPrime
	}
	return h
}

// Len is the number of distinct ops seen.
func (v *Vocab) Len() int { return len(v.names) }

// gramBuckets is the size of the hashed bigram space. Real models have a
// few hundred distinct bigrams; 4096 buckets keep collisions rare while the
// count array stays in L1/L2 cache.
const gramBuckets = 1 << 12

// Profile is an iteration's lightweight profile: its length, the bytes its
// ops allocated, a hash of its token sequence and the sparse bigram count
// vector that similarity is taken over.
type Profile struct {
	Len    int
	Bytes  int64
	Hash   uint64
	Tokens []Token
	grams  []gram // sorted by bucket
	norm   float64
}

type gram struct{ bucket, count uint32 }

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// Encoder records one iteration at a time. Record costs no heap allocation
// once the token buffer has grown to the iteration's length.
type Encoder struct {
	Vocab   *Vocab
	tokens  []Token
	bytes   int64
	hash    uint64
	prev    Token
	counts  [gramBuckets]uint32
	touched []uint32
}

// NewEncoder returns an Encoder over v (a fresh vocabulary when v is nil).
func NewEncoder(v *Vocab) *Encoder {
	if v == nil {
		v = NewVocab()
	}
	e := &Encoder{Vocab: v}
	e.reset()
	return e
}

func (e *Encoder) reset() {
	for _, b := range e.touched {
		e.counts[b] = 0
	}
	e.touched = e.touched[:0]
	e.tokens = e.tokens[:0]
	e.bytes = 0
	e.hash = fnvOffset
	e.prev = math.MaxUint32 // start-of-sequence marker
}

// Record encodes one op; allocBytes is what the op newly allocated (its
// fresh outputs), the signal that catches size changes under an unchanged
// op sequence.
func (e *Encoder) Record(name, overload string, allocBytes int64) Token {
	t := e.Vocab.Token(name, overload)
	e.RecordToken(t, allocBytes)
	return t
}

// RecordToken records an already encoded op.
func (e *Encoder) RecordToken(t Token, allocBytes int64) {
	e.tokens = append(e.tokens, t)
	e.bytes += allocBytes
	if int(t) < len(e.Vocab.stable) {
		e.hash = (e.hash ^ e.Vocab.stable[t]) * fnvPrime
	} else {
		e.hash = (e.hash ^ uint64(t)) * fnvPrime
	}
	b := bigramBucket(e.prev, t)
	if e.counts[b] == 0 {
		e.touched = append(e.touched, b)
	}
	e.counts[b]++
	e.prev = t
}

func bigramBucket(a, b Token) uint32 {
	h := (uint64(a)*0x9E3779B97F4A7C15 ^ uint64(b)) * 0xBF58476D1CE4E5B9
	return uint32(h>>40) & (gramBuckets - 1)
}

// Len is the number of ops recorded in the current iteration.
func (e *Encoder) Len() int { return len(e.tokens) }

// Finish closes the iteration and returns its profile; the encoder is ready
// for the next one. It allocates the profile's own slices (once per
// iteration, not per op).
func (e *Encoder) Finish() Profile {
	p := Profile{Len: len(e.tokens), Bytes: e.bytes, Hash: e.hash}
	p.Tokens = append([]Token(nil), e.tokens...)
	p.grams = make([]gram, 0, len(e.touched))
	for b := uint32(0); b < gramBuckets; b++ {
		if c := e.counts[b]; c != 0 {
			p.grams = append(p.grams, gram{b, c})
			p.norm += float64(c) * float64(c)
		}
	}
	p.norm = math.Sqrt(p.norm)
	e.reset()
	return p
}

// Similarity is the cosine similarity of two profiles' bigram count
// vectors, in [0, 1].
//
// Why bigrams: a cosine over plain op counts ignores order (the same ops
// reshuffled look identical) and a position-by-position comparison breaks on
// any insertion (one skipped op shifts everything after it). Counting
// adjacent pairs keeps local order, is defined for sequences of any two
// lengths, and degrades in proportion to how much of the sequence changed:
// an inserted block of k ops changes about k+1 pairs. Length is judged
// separately (the length-change rule), since a cosine is blind to scale.
func Similarity(a, b *Profile) float64 {
	if a.norm == 0 || b.norm == 0 {
		if a.norm == b.norm {
			return 1
		}
		return 0
	}
	var dot float64
	i, j := 0, 0
	for i < len(a.grams) && j < len(b.grams) {
		switch ga, gb := a.grams[i], b.grams[j]; {
		case ga.bucket < gb.bucket:
			i++
		case ga.bucket > gb.bucket:
			j++
		default:
			dot += float64(ga.count) * float64(gb.count)
			i++
			j++
		}
	}
	return min(1, dot/(a.norm*b.norm))
}
