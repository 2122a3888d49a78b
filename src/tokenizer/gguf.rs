//! Just enough of GGUF to read a model file's metadata (the tokenizer lives there); tensors are the
//! model loader's business. Lengths are bounded so a corrupt file fails cleanly instead of allocating.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

const MAGIC: &[u8; 4] = b"GGUF";
const MAX_STRING: u64 = 1 << 24;
const MAX_ARRAY: u64 = 1 << 26;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::UInt(v) => Some(v),
            Value::Int(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

struct Reader<R: Read> {
    inner: R,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf)?;
        Ok(buf)
    }
    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> std::io::Result<String> {
        let len = self.u64()?;
        if len > MAX_STRING {
            return Err(invalid(format!("string of {len} bytes")));
        }
        let mut buf = vec![0u8; len as usize];
        self.inner.read_exact(&mut buf)?;
        String::from_utf8(buf).map_err(|e| invalid(e.to_string()))
    }
    fn value(&mut self, kind: u32) -> std::io::Result<Value> {
        Ok(match kind {
            0 => Value::UInt(self.bytes::<1>()?[0] as u64),
            1 => Value::Int(self.bytes::<1>()?[0] as i8 as i64),
            2 => Value::UInt(u16::from_le_bytes(self.bytes()?) as u64),
            3 => Value::Int(i16::from_le_bytes(self.bytes()?) as i64),
            4 => Value::UInt(self.u32()? as u64),
            5 => Value::Int(i32::from_le_bytes(self.bytes()?) as i64),
            6 => Value::Float(f32::from_le_bytes(self.bytes()?) as f64),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => {
                let elem = self.u32()?;
                let len = self.u64()?;
                if len > MAX_ARRAY {
                    return Err(invalid(format!("array of {len} elements")));
                }
                Value::Array(
                    (0..len)
                        .map(|_| self.value(elem))
                        .collect::<Result<_, _>>()?,
                )
            }
            10 => Value::UInt(self.u64()?),
            11 => Value::Int(i64::from_le_bytes(self.bytes()?)),
            12 => Value::Float(f64::from_le_bytes(self.bytes()?)),
            other => return Err(invalid(format!("unknown value type {other}"))),
        })
    }
}

fn invalid(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

/// The key/value metadata of a GGUF file (versions 2 and 3).
pub fn read_metadata(path: &Path) -> std::io::Result<BTreeMap<String, Value>> {
    let mut r = Reader {
        inner: BufReader::with_capacity(1 << 20, File::open(path)?),
    };
    if &r.bytes::<4>()? != MAGIC {
        return Err(invalid("not a GGUF file (bad magic)".into()));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(invalid(format!("GGUF version {version} is not supported")));
    }
    let _tensors = r.u64()?;
    let kv_count = r.u64()?;
    let mut out = BTreeMap::new();
    for _ in 0..kv_count {
        let key = r.string()?;
        let kind = r.u32()?;
        out.insert(key, r.value(kind)?);
    }
    Ok(out)
}
