mod parse;
mod stream;
