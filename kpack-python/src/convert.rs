//! MessagePack values (TOC metadata) to and from Python objects.

use kpack_format::msgpack::Value;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// A metadata map for the writer: `str` keys, values of the types
/// MessagePack has (`None`, `bool`, `int`, `float`, `str`, `bytes`, lists,
/// tuples and dicts of those).
pub fn metadata_from_py(d: &Bound<'_, PyDict>) -> PyResult<Vec<(String, Value)>> {
    let mut out = Vec::with_capacity(d.len());
    for (k, v) in d.iter() {
        let key: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err("metadata keys must be str"))?;
        out.push((key, value_from_py(&v)?));
    }
    Ok(out)
}

pub fn value_from_py(v: &Bound<'_, PyAny>) -> PyResult<Value> {
    if v.is_none() {
        return Ok(Value::Nil);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(Value::Boolean(b.is_true()));
    }
    if v.is_instance_of::<PyInt>() {
        if let Ok(i) = v.extract::<i64>() {
            return Ok(Value::from(i));
        }
        let u: u64 = v.extract()?;
        return Ok(Value::from(u));
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return Ok(Value::F64(f.value()));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(Value::from(s.extract::<String>()?));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(Value::Binary(b.as_bytes().to_vec()));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut m = Vec::with_capacity(d.len());
        for (k, x) in d.iter() {
            m.push((value_from_py(&k)?, value_from_py(&x)?));
        }
        return Ok(Value::Map(m));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items: PyResult<Vec<Value>> = v.try_iter()?.map(|x| value_from_py(&x?)).collect();
        return Ok(Value::Array(items?));
    }
    Err(PyTypeError::new_err(format!(
        "metadata value of type {} cannot be stored in a TOC",
        v.get_type().name()?
    )))
}

pub fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Nil => py.None().into_bound(py),
        Value::Boolean(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Integer(i) => match (i.as_i64(), i.as_u64()) {
            (Some(x), _) => x.into_pyobject(py)?.into_any(),
            (None, Some(x)) => x.into_pyobject(py)?.into_any(),
            _ => py.None().into_bound(py),
        },
        Value::F32(f) => PyFloat::new(py, f64::from(*f)).into_any(),
        Value::F64(f) => PyFloat::new(py, *f).into_any(),
        Value::String(s) => match s.as_str() {
            Some(s) => PyString::new(py, s).into_any(),
            None => PyBytes::new(py, s.as_bytes()).into_any(),
        },
        Value::Binary(b) => PyBytes::new(py, b).into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(value_to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Map(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(value_to_py(py, k)?, value_to_py(py, x)?)?;
            }
            d.into_any()
        }
        Value::Ext(_, b) => PyBytes::new(py, b).into_any(),
    })
}

/// Metadata as read from a TOC: a dict in file order.
pub fn metadata_to_py<'py>(py: Python<'py>, m: &[(String, Value)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in m {
        d.set_item(k, value_to_py(py, v)?)?;
    }
    Ok(d)
}

/// A summary (JSON data, as the command's `--json` prints it) as Python
/// objects: dicts, lists, `str`, `int`, `float`, `bool`, `None`.
pub fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value as J;
    Ok(match v {
        J::Null => py.None().into_bound(py),
        J::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(x), _, _) => x.into_pyobject(py)?.into_any(),
            (None, Some(x), _) => x.into_pyobject(py)?.into_any(),
            (None, None, Some(x)) => PyFloat::new(py, x).into_any(),
            _ => py.None().into_bound(py),
        },
        J::String(s) => PyString::new(py, s).into_any(),
        J::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(json_to_py(py, x)?)?;
            }
            l.into_any()
        }
        J::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}
