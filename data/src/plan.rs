//! The driver's side: data sets checked and planned once, before any trial.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use trainer::data::{Block, DataError, DataPlan, DataPlans, DatasetSpec, Format, PLAN_VERSION};

/// Whether `path` is an object-store URL (not a local path or `file://`).
pub(crate) fn is_url(path: &str) -> bool {
    path.contains("://") && !path.starts_with("file://")
}

/// The object stores of the URLs read so far, one client per bucket.
#[derive(Default)]
pub(crate) struct Stores(HashMap<String, Arc<dyn ObjectStore>>);

impl Stores {
    /// The store of `url` (`s3://bucket/key`) and the key in it.
    pub(crate) fn open(&mut self, url: &str) -> Result<(Arc<dyn ObjectStore>, ObjPath), String> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("{url} is not a URL"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!("{url}: no bucket in the URL"));
        }
        let base = format!("{scheme}://{bucket}");
        let store = match self.0.get(&base) {
            Some(s) => Arc::clone(s),
            None => {
                let s = trainer::cloud_store(scheme, &base)?;
                self.0.insert(base, Arc::clone(&s));
                s
            }
        };
        let key = ObjPath::parse(key.trim_matches('/')).map_err(|e| format!("{url}: {e}"))?;
        Ok((store, key))
    }

    /// A Parquet reader of `path` (local or a URL).
    pub(crate) async fn parquet(&mut self, path: &str) -> Result<Box<dyn AsyncFileReader>, String> {
        if is_url(path) {
            let (store, key) = self.open(path)?;
            return Ok(Box::new(ObjectReader { store, key }));
        }
        let file = tokio::fs::File::open(local(path)).await.map_err(|e| e.to_string())?;
        Ok(Box::new(file))
    }

    /// The whole of `path` (local or a URL).
    pub(crate) async fn bytes(&mut self, path: &str) -> Result<Bytes, String> {
        if is_url(path) {
            let (store, key) = self.open(path)?;
            let got = store.get(&key).await.map_err(|e| e.to_string())?;
            return got.bytes().await.map_err(|e| e.to_string());
        }
        tokio::fs::read(local(path)).await.map(Bytes::from).map_err(|e| e.to_string())
    }
}

/// A Parquet file in an object store, read by ranges: the footer, then the
/// column chunks a reader asks for.
struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    key: ObjPath,
}

fn external(e: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: std::ops::Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        Box::pin(async move { self.store.get_range(&self.key, range).await.map_err(external) })
    }

    fn get_byte_ranges(&mut self, ranges: Vec<std::ops::Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        Box::pin(async move { self.store.get_ranges(&self.key, &ranges).await.map_err(external) })
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.store.head(&self.key).await.map_err(external)?.size;
            let meta = ParquetMetaDataReader::new().with_arrow_reader_options(options).load_and_finish(self, size).await?;
            Ok(Arc::new(meta))
        })
    }
}

fn local(path: &str) -> &str {
    path.strip_prefix("file://").unwrap_or(path)
}

/// Plans every data set of `[datasets]`: their files checked and their
/// blocks counted. `seed` is the experiment's (a data set's own wins).
pub async fn plan_all(specs: &BTreeMap<String, DatasetSpec>, seed: u64) -> Result<DataPlans, DataError> {
    let mut stores = Stores::default();
    let mut datasets = BTreeMap::new();
    for (name, spec) in specs {
        let refused = |message: String| DataError::Refused { name: name.clone(), message };
        spec.check().map_err(&refused)?;
        let table = spec.table();
        let format = spec.format();
        let mut files = Vec::new();
        for path in table.path.list() {
            files.extend(expand(&mut stores, path, format).await.map_err(&refused)?);
        }
        let blocks = blocks(&mut stores, &files, format).await.map_err(&refused)?;
        datasets.insert(name.clone(), DataPlan { blocks, shuffle: table.shuffle, seed: table.seed.unwrap_or(seed), split: table.split });
    }
    Ok(DataPlans { version: PLAN_VERSION, datasets })
}

fn has_glob(path: &str) -> bool {
    path.contains(['*', '?', '['])
}

fn of_format(name: &str, format: Format) -> bool {
    let file = name.rsplit('/').next().unwrap_or(name);
    !file.starts_with('.') && format.suffixes().iter().any(|s| file.ends_with(s))
}

/// The files a path names: itself, a directory's files of the format, or
/// a glob's matches; local or in an object store.
async fn expand(stores: &mut Stores, path: &str, format: Format) -> Result<Vec<String>, String> {
    if is_url(path) {
        return expand_url(stores, path, format).await;
    }
    let path = local(path);
    let abs = std::path::absolute(path).map_err(|e| format!("{path}: {e}"))?;
    let shown = abs.display().to_string();
    if has_glob(path) {
        let found = glob::glob(&shown).map_err(|e| format!("{path}: not a valid glob: {e}"))?;
        let mut files: Vec<String> = found.filter_map(Result::ok).filter(|p| p.is_file()).map(|p| p.display().to_string()).collect();
        files.sort();
        if files.is_empty() {
            return Err(format!("no file matches {path}"));
        }
        return Ok(files);
    }
    if abs.is_dir() {
        let entries = std::fs::read_dir(&abs).map_err(|e| format!("cannot list {shown}: {e}"))?;
        let mut files: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().is_file() && of_format(&e.file_name().to_string_lossy(), format))
            .map(|e| e.path().display().to_string())
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(format!("directory {shown} holds no {} file", format.as_str()));
        }
        return Ok(files);
    }
    if !abs.exists() {
        return Err(format!("{shown} does not exist"));
    }
    Ok(vec![shown])
}

async fn expand_url(stores: &mut Stores, url: &str, format: Format) -> Result<Vec<String>, String> {
    let (store, key) = stores.open(url)?;
    let base_url = url.split_once("://").map(|(s, rest)| format!("{s}://{}", rest.split('/').next().unwrap_or(""))).unwrap_or_default();
    let raw_key = url.split_once("://").and_then(|(_, rest)| rest.split_once('/')).map_or("", |(_, k)| k);
    let pattern = if has_glob(raw_key) {
        Some(glob::Pattern::new(raw_key.trim_start_matches('/')).map_err(|e| format!("{url}: not a valid glob: {e}"))?)
    } else {
        None
    };
    if pattern.is_none() && !url.ends_with('/') && store.head(&key).await.is_ok() {
        return Ok(vec![url.to_string()]);
    }
    let listed: Vec<object_store::ObjectMeta> = match &pattern {
        Some(_) => {
            let prefix = raw_key.split(['*', '?', '[']).next().unwrap_or("").rsplit_once('/').map_or("", |(p, _)| p);
            let prefix = ObjPath::parse(prefix).map_err(|e| format!("{url}: {e}"))?;
            store.list(Some(&prefix)).try_collect().await.map_err(|e| format!("cannot list {url}: {e}"))?
        }
        None => store.list_with_delimiter(Some(&key)).await.map_err(|e| format!("cannot list {url}: {e}"))?.objects,
    };
    let mut files: Vec<String> = listed
        .into_iter()
        .map(|m| m.location.to_string())
        .filter(|k| match &pattern {
            Some(p) => p.matches(k),
            None => of_format(k, format),
        })
        .map(|k| format!("{base_url}/{k}"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("{url} does not exist, or holds no {} file", format.as_str()));
    }
    Ok(files)
}

/// What this build reads of Parquet's compressions.
fn readable(c: Compression) -> bool {
    matches!(
        c,
        Compression::UNCOMPRESSED
            | Compression::SNAPPY
            | Compression::GZIP(_)
            | Compression::LZ4
            | Compression::LZ4_RAW
            | Compression::ZSTD(_)
    )
}

/// The files' blocks, their columns checked against the first file's.
async fn blocks(stores: &mut Stores, files: &[String], format: Format) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut first: Option<(String, Schema)> = None;
    for path in files {
        let cannot = |e: String| format!("cannot read {path} as {}: {e}", format.as_str());
        let schema = match format {
            Format::Parquet => {
                let reader = stores.parquet(path).await.map_err(cannot)?;
                let builder = ParquetRecordBatchStreamBuilder::new(reader).await.map_err(|e| cannot(e.to_string()))?;
                let meta = builder.metadata();
                for (i, rg) in meta.row_groups().iter().enumerate() {
                    if let Some(c) = rg.columns().iter().find(|c| !readable(c.compression())) {
                        return Err(format!(
                            "{path}: column {} is compressed with {}, which nestor does not read (write it with zstd, snappy, gzip, lz4 or none)",
                            c.column_path(),
                            c.compression()
                        ));
                    }
                    blocks.push(Block {
                        path: path.clone(),
                        format,
                        rows: rg.num_rows().max(0) as u64,
                        row_group: Some(i),
                        columns: Vec::new(),
                    });
                }
                builder.schema().as_ref().clone()
            }
            Format::Csv | Format::Json => {
                let bytes = stores.bytes(path).await.map_err(cannot)?;
                let (schema, rows) = infer(&bytes, format).map_err(cannot)?;
                blocks.push(Block { path: path.clone(), format, rows: rows as u64, row_group: None, columns: columns_of(&schema) });
                schema
            }
        };
        match &first {
            None => first = Some((path.clone(), schema)),
            Some((first_path, first_schema)) if !same_columns(first_schema, &schema) => {
                return Err(format!("{path} has columns {}, unlike {first_path} ({})", columns(&schema), columns(first_schema)));
            }
            Some(_) => {}
        }
    }
    Ok(blocks)
}

/// A CSV or JSON file's columns and rows, read through once.
pub(crate) fn infer(bytes: &[u8], format: Format) -> Result<(Schema, usize), String> {
    match format {
        Format::Csv => arrow_csv::reader::Format::default().with_header(true).infer_schema(bytes, None).map_err(|e| e.to_string()),
        _ => arrow_json::reader::infer_json_schema(bytes, None).map_err(|e| e.to_string()),
    }
}

/// `schema`'s columns as a plan keeps them, when every type reads back as
/// itself (else none: the ranks infer them).
fn columns_of(schema: &Schema) -> Vec<(String, String)> {
    let columns: Vec<(String, String)> = schema.fields().iter().map(|f| (f.name().clone(), f.data_type().to_string())).collect();
    let exact = schema.fields().iter().zip(&columns).all(|(f, (_, t))| t.parse::<DataType>().is_ok_and(|d| &d == f.data_type()));
    if exact {
        columns
    } else {
        Vec::new()
    }
}

/// The schema a plan's `columns` name; `None` when it names none or a type
/// does not parse (the reader then infers them).
pub(crate) fn schema_of(columns: &[(String, String)]) -> Option<Schema> {
    if columns.is_empty() {
        return None;
    }
    let fields: Option<Vec<Field>> =
        columns.iter().map(|(name, t)| t.parse::<DataType>().ok().map(|d| Field::new(name, d, true))).collect();
    fields.map(Schema::new)
}

fn same_columns(a: &Schema, b: &Schema) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields().iter().zip(b.fields()).all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type())
}

fn columns(s: &Schema) -> String {
    s.fields().iter().map(|f| format!("{}: {}", f.name(), f.data_type())).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_csv_files_columns_found_once_read_back_as_found() {
        let text = b"id,score,ok,name,day\n1,0.5,true,a,2024-01-02\n2,1.5,false,b,2024-01-03\n";
        let (schema, rows) = infer(text, Format::Csv).unwrap();
        assert_eq!(rows, 2);
        let columns = columns_of(&schema);
        assert_eq!(columns.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["id", "score", "ok", "name", "day"]);
        let back = schema_of(&columns).expect("every inferred type reads back");
        assert!(same_columns(&back, &schema), "{back:?} != {schema:?}");
        let json = b"{\"a\": 1, \"b\": [1, 2], \"c\": {\"d\": \"x\"}}\n";
        let (schema, _) = infer(json, Format::Json).unwrap();
        // Types that do not read back exactly are left to the ranks to find.
        match schema_of(&columns_of(&schema)) {
            Some(back) => assert!(same_columns(&back, &schema)),
            None => assert!(columns_of(&schema).is_empty()),
        }
    }

    #[test]
    fn a_plan_without_columns_or_with_a_type_this_build_cannot_read_leaves_them_to_the_rank() {
        assert!(schema_of(&[]).is_none());
        assert!(schema_of(&[("a".into(), "Int64".into()), ("b".into(), "NoSuchType".into())]).is_none());
        let s = schema_of(&[("a".into(), "Int64".into()), ("b".into(), "Utf8".into())]).unwrap();
        assert_eq!(s.field(1).data_type(), &DataType::Utf8);
    }
}
