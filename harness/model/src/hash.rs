//! A small, fast hasher with a 128-bit output, for state fingerprints and the explorer's maps.
//! (The standard library's SipHash is built for hash-flooding resistance, which an explorer
//! does not need, and is slow in debug builds.)

use std::hash::{BuildHasherDefault, Hasher};

/// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Two independently mixed 64-bit lanes.
#[derive(Debug, Clone, Copy)]
pub struct Fingerprint {
    a: u64,
    b: u64,
    len: u64,
}

impl Default for Fingerprint {
    fn default() -> Self {
        Self {
            a: 0x243f_6a88_85a3_08d3,
            b: 0x1319_8a2e_0370_7344,
            len: 0,
        }
    }
}

impl Fingerprint {
    pub fn finish128(&self) -> u128 {
        let a = mix(self.a ^ self.len);
        let b = mix(self.b ^ self.len.rotate_left(17));
        (u128::from(b) << 64) | u128::from(a)
    }
}

impl Hasher for Fingerprint {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.write_u64(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    fn write_u64(&mut self, i: u64) {
        // One multiply and shift per lane (each a bijection of the lane for a given input);
        // `finish` and `finish128` mix fully.
        self.len = self.len.wrapping_add(1);
        let a = (self.a ^ i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.a = a ^ (a >> 29);
        let b = (self.b ^ i.rotate_left(32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
        self.b = b ^ (b >> 31);
    }

    fn write_u128(&mut self, i: u128) {
        self.write_u64(i as u64);
        self.write_u64((i >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        mix(self.a ^ self.len)
    }
}

/// For `HashMap`s and `HashSet`s.
pub type Build = BuildHasherDefault<Fingerprint>;

/// The 64-bit hash of one value.
pub fn hash_one<T: std::hash::Hash>(value: &T) -> u64 {
    let mut h = Fingerprint::default();
    value.hash(&mut h);
    h.finish()
}
