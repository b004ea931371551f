/* ===========================================================================================
   CRC-32 and inflate (RFC 1951): the checksums and decompression that .npz (zip) and gzipped
   IDX files share.
   =========================================================================================== */

/* CRC-32 (zip's, reflected 0xedb88320), eight bytes per step ("slicing by 8"). */
static void tb__crc32_init(tb__crc32_tables *c) {
    uint32_t n, k, v;
    for (n = 0; n < 256; ++n) {
        for (v = n, k = 0; k < 8; ++k)
            v = (v & 1) ? 0xedb88320u ^ (v >> 1) : v >> 1;
        c->t[0][n] = v;
    }
    for (k = 1; k < 8; ++k)
        for (n = 0; n < 256; ++n)
            c->t[k][n] = (c->t[k - 1][n] >> 8) ^ c->t[0][c->t[k - 1][n] & 0xff];
}

static uint32_t tb__crc32(const tb__crc32_tables *c, uint32_t crc, const unsigned char *p,
                          size_t n) {
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc ^ tb__le32(p), hi = tb__le32(p + 4);
        crc = c->t[7][lo & 0xff] ^ c->t[6][(lo >> 8) & 0xff] ^ c->t[5][(lo >> 16) & 0xff] ^
              c->t[4][lo >> 24] ^ c->t[3][hi & 0xff] ^ c->t[2][(hi >> 8) & 0xff] ^
              c->t[1][(hi >> 16) & 0xff] ^ c->t[0][hi >> 24];
    }
    while (n-- > 0)
        crc = c->t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* Deflate (RFC 1951) into a buffer of known size. Huffman codes decode through a table for codes
   up to TB__HUFF_FAST bits and bit by bit (canonical order) for longer ones. */
#define TB__HUFF_FAST 9

typedef struct tb__huff {
    uint16_t fast[1 << TB__HUFF_FAST]; /* symbol | length << 9; 0: a longer code */
    uint16_t count[16];                /* codes of each length */
    uint16_t symbol[288];              /* symbols in canonical order */
} tb__huff;

static void tb__inf_refill(tb__inflater *s) {
    while (s->nbits <= 56) {
        if (s->in_pos < s->in_len)
            s->bits |= (uint64_t)s->in[s->in_pos++] << s->nbits;
        else
            s->pad++;
        s->nbits += 8;
    }
}

static uint32_t tb__inf_bits(tb__inflater *s, int n) {
    uint32_t v;
    if (s->nbits < n) tb__inf_refill(s);
    v = (uint32_t)(s->bits & ((1u << n) - 1));
    s->bits >>= n;
    s->nbits -= n;
    return v;
}

/* Whether the decoder read past the end of the input. */
static bool tb__inf_overrun(const tb__inflater *s) {
    return s->nbits < 8 * s->pad;
}

static bool tb__huff_build(tb__huff *h, const uint8_t *lengths, int n) {
    uint16_t offs[16];
    int len, sym, left = 1, index = 0;
    uint32_t code = 0;
    memset(h->count, 0, sizeof h->count);
    memset(h->fast, 0, sizeof h->fast);
    for (sym = 0; sym < n; ++sym)
        h->count[lengths[sym]]++;
    h->count[0] = 0;
    for (len = 1; len <= 15; ++len) {
        left = (left << 1) - h->count[len];
        if (left < 0) return false; /* over-subscribed */
    }
    offs[1] = 0;
    for (len = 1; len < 15; ++len)
        offs[len + 1] = (uint16_t)(offs[len] + h->count[len]);
    for (sym = 0; sym < n; ++sym)
        if (lengths[sym] != 0) h->symbol[offs[lengths[sym]]++] = (uint16_t)sym;
    for (len = 1; len <= TB__HUFF_FAST; ++len, code <<= 1) {
        int k;
        for (k = 0; k < h->count[len]; ++k, ++code, ++index) {
            uint32_t rev = 0, r;
            int b;
            for (b = 0; b < len; ++b)
                rev |= ((code >> b) & 1u) << (len - 1 - b);
            for (r = rev; r < (1u << TB__HUFF_FAST); r += 1u << len)
                h->fast[r] = (uint16_t)(h->symbol[index] | (len << 9));
        }
    }
    return true;
}

/* The next symbol, or -1 for a code the table does not have. */
static int tb__huff_decode(tb__inflater *s, const tb__huff *h) {
    int len, code = 0, first = 0, index = 0;
    uint16_t e;
    if (s->nbits < 16) tb__inf_refill(s);
    e = h->fast[s->bits & ((1u << TB__HUFF_FAST) - 1)];
    if (e != 0) {
        s->bits >>= e >> 9;
        s->nbits -= e >> 9;
        return e & 511;
    }
    for (len = 1; len <= 15; ++len) {
        int count = h->count[len];
        code |= (int)(s->bits & 1);
        s->bits >>= 1;
        s->nbits--;
        if (code - count < first) return h->symbol[index + (code - first)];
        index += count;
        first = (first + count) << 1;
        code <<= 1;
    }
    return -1;
}

static const uint16_t tb__inf_len_base[29] = {3,  4,  5,  6,   7,   8,   9,   10,  11, 13,
                                              15, 17, 19, 23,  27,  31,  35,  43,  51, 59,
                                              67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t tb__inf_len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                              2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t tb__inf_dist_base[30] = {
    1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
    193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t tb__inf_dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                               6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

/* One block's symbols until its end code. NULL on success, else the reason. */
static const char *tb__inf_codes(tb__inflater *s, const tb__huff *lit, const tb__huff *dist) {
    for (;;) {
        int sym = tb__huff_decode(s, lit);
        if (sym < 0) return "a literal/length code that the block's table does not have";
        if (tb__inf_overrun(s)) return "the compressed data end in the middle of a block";
        if (sym < 256) {
            if (s->out_pos >= s->out_len) {
                s->full = true;
                return "more data than the entry's size";
            }
            s->out[s->out_pos++] = (unsigned char)sym;
        } else if (sym == 256) {
            return NULL;
        } else {
            size_t len, d, k;
            int dsym;
            sym -= 257;
            if (sym >= 29) return "an invalid length code";
            len = tb__inf_len_base[sym] + tb__inf_bits(s, tb__inf_len_extra[sym]);
            dsym = tb__huff_decode(s, dist);
            if (dsym < 0 || dsym >= 30) return "an invalid distance code";
            d = tb__inf_dist_base[dsym] + tb__inf_bits(s, tb__inf_dist_extra[dsym]);
            if (tb__inf_overrun(s)) return "the compressed data end in the middle of a block";
            if (d > s->out_pos) return "a distance before the start of the data";
            if (len > s->out_len - s->out_pos) {
                /* what fits is copied, so a caller reading only a prefix gets all of it */
                len = s->out_len - s->out_pos;
                s->full = true;
            }
            if (d >= len) { /* no overlap */
                memcpy(s->out + s->out_pos, s->out + s->out_pos - d, len);
                s->out_pos += len;
            } else {
                for (k = 0; k < len; ++k, ++s->out_pos)
                    s->out[s->out_pos] = s->out[s->out_pos - d];
            }
            if (s->full) return "more data than the entry's size";
        }
    }
}

static const char *tb__inf_stored(tb__inflater *s) {
    uint32_t len, nlen;
    tb__inf_bits(s, s->nbits % 8);
    len = tb__inf_bits(s, 16);
    nlen = tb__inf_bits(s, 16);
    if (tb__inf_overrun(s)) return "the compressed data end in a stored block's header";
    if (len != (~nlen & 0xffffu)) return "a stored block whose length check fails";
    if (len > s->out_len - s->out_pos) {
        len = (uint32_t)(s->out_len - s->out_pos);
        s->full = true;
    }
    while (len > 0 && s->nbits >= 8) {
        s->out[s->out_pos++] = (unsigned char)tb__inf_bits(s, 8);
        len--;
    }
    if (tb__inf_overrun(s)) return "the compressed data end in a stored block";
    if (len > s->in_len - s->in_pos) return "the compressed data end in a stored block";
    memcpy(s->out + s->out_pos, s->in + s->in_pos, len);
    s->out_pos += len;
    s->in_pos += len;
    return s->full ? "more data than the entry's size" : NULL;
}

static const char *tb__inf_dynamic(tb__inflater *s, tb__huff *lit, tb__huff *dist) {
    static const uint8_t order[19] = {16, 17, 18, 0, 8,  7, 9,  6, 10, 5,
                                      11, 4,  12, 3, 13, 2, 14, 1, 15};
    uint8_t lengths[320];
    int nlen, ndist, ncode, i = 0, k;
    nlen = (int)tb__inf_bits(s, 5) + 257;
    ndist = (int)tb__inf_bits(s, 5) + 1;
    ncode = (int)tb__inf_bits(s, 4) + 4;
    if (nlen > 286 || ndist > 30) return "a block with too many codes";
    memset(lengths, 0, sizeof lengths);
    for (k = 0; k < ncode; ++k)
        lengths[order[k]] = (uint8_t)tb__inf_bits(s, 3);
    if (!tb__huff_build(lit, lengths, 19)) return "an over-subscribed code length code";
    while (i < nlen + ndist) {
        int sym = tb__huff_decode(s, lit), repeat;
        uint8_t value = 0;
        if (sym < 0) return "a code length code that the table does not have";
        if (tb__inf_overrun(s)) return "the compressed data end in a block's code lengths";
        if (sym < 16) {
            lengths[i++] = (uint8_t)sym;
            continue;
        }
        if (sym == 16) {
            if (i == 0) return "a repeated code length with none before it";
            value = lengths[i - 1];
            repeat = 3 + (int)tb__inf_bits(s, 2);
        } else if (sym == 17) {
            repeat = 3 + (int)tb__inf_bits(s, 3);
        } else {
            repeat = 11 + (int)tb__inf_bits(s, 7);
        }
        if (i + repeat > nlen + ndist) return "code lengths that run past the codes";
        while (repeat-- > 0)
            lengths[i++] = value;
    }
    if (lengths[256] == 0) return "a block without an end code";
    if (!tb__huff_build(lit, lengths, nlen)) return "an over-subscribed literal/length code";
    if (!tb__huff_build(dist, lengths + nlen, ndist)) return "an over-subscribed distance code";
    return NULL;
}

/* Inflates all of s->in into exactly s->out_len bytes. NULL on success, else the reason. When
   the data are longer, s->full is set and s->out holds their first s->out_len bytes (a caller
   may inflate a prefix that way); s->done says the last block ended. */
static const char *tb__inflate(tb__inflater *s) {
    tb__huff lit, dist;
    uint32_t final;
    do {
        const char *why = NULL;
        uint32_t type;
        final = tb__inf_bits(s, 1);
        type = tb__inf_bits(s, 2);
        if (tb__inf_overrun(s)) return "the compressed data end before the last block";
        if (type == 0) {
            why = tb__inf_stored(s);
        } else if (type == 1) {
            uint8_t lengths[288];
            int i;
            for (i = 0; i < 288; ++i)
                lengths[i] = (uint8_t)(i < 144 ? 8 : i < 256 ? 9 : i < 280 ? 7 : 8);
            tb__huff_build(&lit, lengths, 288);
            for (i = 0; i < 30; ++i)
                lengths[i] = 5;
            tb__huff_build(&dist, lengths, 30);
            why = tb__inf_codes(s, &lit, &dist);
        } else if (type == 2) {
            why = tb__inf_dynamic(s, &lit, &dist);
            if (why == NULL) why = tb__inf_codes(s, &lit, &dist);
        } else {
            why = "an invalid block type";
        }
        if (why != NULL) return why;
    } while (!final);
    s->done = true;
    if (s->out_pos != s->out_len) return "less data than the entry's size";
    return NULL;
}

#undef TB__HUFF_FAST
